package delayqueue

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dqueue/delayqueue/internal/flakyconn"
	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPopReturnsErrNoJobWhenNothingIsReady(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		pushed(t, q, &Job{Topic: "t", Delay: time.Hour})
		_, err := q.Pop(ctx, "t", 0)
		assert.ErrorIs(t, err, ErrNoJob)
		_, err = q.Pop(ctx, "t", 20*time.Millisecond)
		assert.ErrorIs(t, err, ErrNoJob)
		_, err = q.Pop(ctx, "other", 0)
		assert.ErrorIs(t, err, ErrNoJob, "topics are separate")
		_, err = q.Pop(ctx, "a{b", time.Second)
		assert.ErrorIs(t, err, ErrInvalidTopic)
	})
}

func TestPopEndsWithItsContextAndWithClose(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		q := newQueue(t, be.client)
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := q.Pop(ctx, "t", time.Hour)
			errc <- err
		}()
		cancel()
		assert.ErrorIs(t, <-errc, context.Canceled)

		go func() {
			_, err := q.Pop(context.Background(), "t", time.Hour)
			errc <- err
		}()
		closeQueue(t, q)
		assert.ErrorIs(t, <-errc, ErrClosed)
	})
}

func TestPopIsWokenWhenAJobBecomesReady(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		// With an hour-long safety poll, only a wake-up can deliver the
		// job before the Pop's timeout.
		q := newQueue(t, be.client, WithSafetyPoll(time.Hour), WithLease(time.Hour))
		startQueue(t, q)
		got := popOneLater(q, "t", time.Minute)
		// Wait until the Pop waits in a blocked call, then push.
		require.Eventually(t, func() bool { return blockedFor(q, "t") }, 30*time.Second, time.Millisecond)
		id := pushed(t, q, &Job{Topic: "t", Delay: 100 * time.Millisecond})
		job := (<-got).job(t)
		require.NotNil(t, job)
		assert.Equal(t, id, job.ID)
	})
}

func TestPopSkipsStaleIDs(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		var removed []string
		for i := range staleSkips + 10 {
			removed = append(removed, pushed(t, q, &Job{ID: "gone-" + strconv.Itoa(i), Topic: "t"}))
		}
		keep := pushed(t, q, &Job{Topic: "t", Body: []byte("keep")})
		for _, id := range removed {
			require.NoError(t, q.Remove(ctx, id))
		}
		job, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err, "more stale IDs than one call drops are skipped too")
		assert.Equal(t, keep, job.ID)
		assert.Equal(t, 1, job.Attempts)
		assert.Equal(t, StateReserved, job.State)
	})
}

func TestIdlePopSendsRedisAlmostNothing(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	c := s.Client(t)
	q := newQueue(t, c, WithSafetyPoll(time.Hour))
	_, err := q.Pop(ctx, "t", 0) // subscribe and look once
	require.ErrorIs(t, err, ErrNoJob)
	subscribed(t, q, "t")
	before := commandCalls(t, c)
	_, err = q.Pop(ctx, "t", 500*time.Millisecond)
	require.ErrorIs(t, err, ErrNoJob)
	after := commandCalls(t, c)
	assert.LessOrEqual(t, scriptCalls(after)-scriptCalls(before), int64(q.opts.buckets),
		"a waiting Pop looks at each bucket at most once, then waits for a wake-up")
}

// commandCalls reads INFO commandstats: command name -> calls.
func commandCalls(t *testing.T, c redis.UniversalClient) map[string]int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	calls := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if n, ok := strings.CutPrefix(kv, "calls="); ok {
				calls[strings.TrimPrefix(name, "cmdstat_")], _ = strconv.ParseInt(n, 10, 64)
			}
		}
	}
	return calls
}

func TestReserveManyTakesEachJobOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		ids := []string{pushed(t, q, &Job{Topic: "t"}), pushed(t, q, &Job{Topic: "t"}), pushed(t, q, &Job{Topic: "t"})}
		// An ID twice in the list (the trace of a script cut off half-way)
		// must not give one job two reservations in one call.
		require.NoError(t, be.client.RPush(ctx, q.keys.bucket(0).ready("t"), ids[1]).Err())
		c, err := q.reserve(ctx, 0, "t", 10, 0, reserveGreedy)
		require.NoError(t, err)
		jobs := c.jobs
		assert.Equal(t, reserveRanOut, c.status)
		require.Len(t, jobs, 3)
		reservations := map[int64]bool{}
		for i, job := range jobs {
			assert.Equal(t, ids[i], job.ID, "oldest first")
			assert.Equal(t, StateReserved, job.State)
			reservations[job.reservation] = true
			v, err := be.client.HGet(ctx, q.keys.bucket(0).pool, job.ID).Bytes()
			require.NoError(t, err)
			stored, err := decodeJob(job.ID, v)
			require.NoError(t, err)
			assert.Equal(t, job.reservation, stored.reservation, "the reservation handed out is the one stored")
		}
		assert.Len(t, reservations, 3, "every reservation has a reservation of its own")
		for _, job := range jobs {
			require.NoError(t, q.finishWithin(ctx, job.ID, job.reservation, "", false, 0, 0))
		}
	})
}

func TestConcurrentPopsAndFinishesDeliverEachJobOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(2))
		const n = 200
		pushNow(t, q, n)
		var mu sync.Mutex
		seen := map[string]int{}
		var wg sync.WaitGroup
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					job, err := q.Pop(ctx, "t", 0)
					if errors.Is(err, ErrNoJob) {
						return
					}
					if !assert.NoError(t, err) {
						return
					}
					assert.NoError(t, q.Finish(ctx, job.ID))
					mu.Lock()
					seen[job.ID]++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		assert.Len(t, seen, n, "every job delivered")
		for id, c := range seen {
			assert.Equal(t, 1, c, "job %s delivered once", id)
		}
		st, err := readKeyStats(ctx, q, "t")
		require.NoError(t, err)
		assert.Zero(t, st.Jobs, "every job finished")
	})
}

func TestPopsOfManyJobsStayWithinAScriptsLimits(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		// Redis's Lua unpacks at most 8,000 values: a reserve call for
		// thousands of jobs must be split, never fail half-way.
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		const n = 5000
		pushNow(t, q, n)
		got, err := q.pop(ctx, "t", n, 0)
		require.NoError(t, err)
		assert.Len(t, got, maxReserve, "one call reserves at most maxReserve jobs")
		var mu sync.Mutex
		taken := len(got)
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() { // coalesced calls that want more than one call may take
				defer wg.Done()
				got, err := q.pop(ctx, "t", 2000, 0)
				assert.NoError(t, err)
				mu.Lock()
				taken += len(got)
				mu.Unlock()
			}()
		}
		wg.Wait()
		st, err := readKeyStats(ctx, q, "t")
		require.NoError(t, err)
		assert.Equal(t, n-taken, st.Ready, "every ID not reserved is still in the ready list")
		assert.Equal(t, taken, st.Scheduled, "every job reserved waits for its reservation deadline")
	})
}

// pushNow pushes n jobs of topic "t", due now, with PushMany.
func pushNow(t testing.TB, q *DelayQueue, n int) {
	t.Helper()
	jobs := make([]*Job, n)
	for i := range jobs {
		jobs[i] = &Job{Topic: "t"}
	}
	_, err := q.PushMany(context.Background(), jobs)
	require.NoError(t, err)
}

// subscribed waits until Redis has confirmed the subscription to the ready
// channels of topic.
// notesOf returns q's notifier, made if need be.
func notesOf(t *testing.T, q *DelayQueue) *notifier {
	t.Helper()
	_, err := q.waiting()
	require.NoError(t, err)
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.notes
}

func subscribed(t *testing.T, q *DelayQueue, topic string) {
	t.Helper()
	n := notesOf(t, q)
	n.mu.Lock()
	var subs []*subscription
	for _, sub := range n.subs {
		subs = append(subs, sub)
	}
	n.mu.Unlock()
	require.NoError(t, n.confirmedAll(context.Background(), subs))
	// The confirmations have woken whoever waited; let that look happen.
	_, err := q.Pop(context.Background(), topic, 0)
	require.ErrorIs(t, err, ErrNoJob)
}

// A reserve call finishes the jobs it carries first, as finish.lua does,
// answering for each after the jobs it reserves, and counts them. Its
// second run (go-redis sends it again when the reply is lost) finds those
// jobs gone, and answers for them from the first run's record, whether the
// call reserved jobs or not.
func TestAReserveCallFinishesTheJobsItCarriesFirst(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		for range 3 {
			pushed(t, q, &Job{Topic: "t"})
		}
		done, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err)
		kept, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err)
		// run sends c twice, as a call whose reply was lost, and returns
		// each run's finish answers and jobs.
		run := func(c *scriptCall) (answers [2][]int64, jobs [2][]*Job) {
			for i := range 2 {
				q.sendCalls(ctx, []*scriptCall{c})
				answers[i], err = reserveFinishes(c)
				require.NoError(t, err)
				jobs[i], _, _, err = q.reserved(ctx, 0, "t", c)
				require.NoError(t, err)
			}
			q.answered([]*scriptCall{c})
			return answers, jobs
		}
		answers, jobs := run(q.reserveCall(0, "t", 2, 0, reserveGreedy, []any{done.ID, done.reservation, "", kept.ID, kept.reservation + 1, "", "nope", int64(1), ""}, 0))
		assert.Equal(t, []int64{finishDone, finishLost, finishNoJob}, answers[0])
		assert.Equal(t, answers[0], answers[1], "the second run answers as the first")
		require.Len(t, jobs[0], 1, "the one job left ready")
		require.Len(t, jobs[1], 1)
		assert.Equal(t, jobs[0][0].ID, jobs[1][0].ID)
		_, err = q.Get(ctx, done.ID)
		assert.ErrorIs(t, err, ErrNotFound)
		counts, err := q.Counts(ctx, "t")
		require.NoError(t, err)
		assert.Equal(t, Counts{Reserved: 2}, counts, "the finished job is counted off, once")

		// Nothing left to reserve: the call's record keeps the answers.
		answers, jobs = run(q.reserveCall(0, "t", 1, 0, reserveGreedy, []any{kept.ID, kept.reservation, ""}, 0))
		assert.Equal(t, [2][]int64{{finishDone}, {finishDone}}, answers)
		assert.Empty(t, jobs[0])
		assert.Empty(t, jobs[1])
		counts, err = q.Counts(ctx, "t")
		require.NoError(t, err)
		assert.Equal(t, Counts{Reserved: 1}, counts)
	})
}

func TestAReserveRunTwiceReturnsTheSameJobs(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		ids := []string{pushed(t, q, &Job{Topic: "t"}), pushed(t, q, &Job{Topic: "t"}), pushed(t, q, &Job{Topic: "t"})}
		bk := q.keys.bucket(0)
		// One reserve call as go-redis sends it, and sends it again when
		// the reply is lost.
		callAs := func(name string) *redis.Cmd {
			return scriptReserve.on(q.plain).Run(ctx, be.client,
				[]string{bk.ready("t"), bk.pool, bk.zset, bk.reservations, bk.record("slot-1"), bk.counts, bk.signals("t"), bk.paused, bk.dedup},
				bk.wake, q.pub, staleSkips, "t", 2, 60_000, 0, true, name, 0)
		}
		call := func() *redis.Cmd { return callAs("call-1") }
		first, _, _, err := reserveResult(call(), 0)
		require.NoError(t, err)
		again, _, _, err := reserveResult(call(), 0)
		require.NoError(t, err)
		require.Len(t, first, 2)
		for _, job := range first {
			assert.False(t, job.dueAt.IsZero(), "the first run says when each job was due")
			assert.True(t, job.dueAt.Equal(job.RunAt), "a popped job carries its due time")
			job.dueAt, job.RunAt = time.Time{}, time.Time{} // a run that answers from the record does not know
		}
		assert.Equal(t, first, again, "the second run answers with the first one's jobs")
		for _, job := range first {
			got, err := q.Get(ctx, job.ID)
			require.NoError(t, err)
			assert.Equal(t, 1, got.Attempts, "one attempt spent")
		}
		rest, err := q.Get(ctx, ids[2])
		require.NoError(t, err)
		assert.Equal(t, StateReady, rest.State, "the second run reserved nothing more")

		// Once the first job is finished, a late run answers with what
		// the first run reserved and is still held under its reservations,
		// in its place: the finished job's place is kept, empty, so that
		// the grant of each job after it is still that of its place.
		require.NoError(t, q.finishWithin(ctx, first[0].ID, first[0].reservation, "", false, 0, 0))
		late, _, _, err := reserveResult(call(), 0)
		require.NoError(t, err)
		assert.Equal(t, []*Job{nil, first[1]}, late)
		ttl, err := be.client.PTTL(ctx, bk.record("slot-1")).Result()
		require.NoError(t, err)
		assert.Greater(t, ttl, time.Duration(0), "a record expires on its own")

		// The caller's next call with the same record key (this one was
		// answered) is no second run: it reserves what is left, and its
		// record takes the place of this one's.
		next, _, _, err := reserveResult(callAs("call-2"), 0)
		require.NoError(t, err)
		require.Len(t, next, 1)
		assert.Equal(t, ids[2], next[0].ID)
		again, _, _, err = reserveResult(callAs("call-2"), 0)
		require.NoError(t, err)
		require.Len(t, again, 1, "a second run of the next call answers from its record")
		assert.Equal(t, ids[2], again[0].ID)
	})
}

// A process's reserve calls write over the records of those answered
// before them: however many jobs it pops, it keeps about as many records
// as it has reserve calls under way at once.
func TestReserveCallsWriteOverTheirRecords(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		const jobs = 50
		for range jobs {
			pushed(t, q, &Job{Topic: "t"})
		}
		for range jobs {
			job, err := q.Pop(ctx, "t", time.Second)
			require.NoError(t, err)
			require.NoError(t, q.Finish(ctx, job.ID))
		}
		bk := q.keys.bucket(0)
		node := redis.Cmdable(be.client)
		if cc, ok := be.client.(*redis.ClusterClient); ok {
			master, err := cc.MasterForKey(ctx, bk.pool)
			require.NoError(t, err)
			node = master
		}
		records, err := node.Keys(ctx, bk.record("*")).Result()
		require.NoError(t, err)
		assert.Len(t, records, 1, "one pop at a time: one record, written over %d times", jobs)
	})
}

func TestALostReserveReplySpendsNoAttempt(t *testing.T) {
	forEachFlakyBackend(t, func(t *testing.T, c *redis.Client, d *flakyconn.Dialer) {
		ctx := context.Background()
		q := newQueue(t, c, WithBuckets(1), WithMaxAttempts(1), WithDefaultTTR(200*time.Millisecond))
		a := pushed(t, q, &Job{Topic: "t"})
		b := pushed(t, q, &Job{Topic: "t"})
		// The reserve call runs, its reply is lost, and go-redis sends it
		// again: the Pop must get what the first run reserved, or that job
		// would go to the dead letters after its TTR, never received.
		fired := d.LoseNextReply(loadedScript(t, q, scriptReserve)) // or the lost reply would be NOSCRIPT's
		first, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err)
		require.True(t, fired())
		assert.Equal(t, a, first.ID)
		assert.Equal(t, 1, first.Attempts)
		require.NoError(t, q.Finish(ctx, first.ID))
		second, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err)
		assert.Equal(t, b, second.ID)
		require.NoError(t, q.Finish(ctx, second.ID))

		startQueue(t, q)
		require.Eventually(t, func() bool {
			st, err := readKeyStats(ctx, q, "t")
			return err == nil && st.Scheduled == 0
		}, 30*time.Second, 10*time.Millisecond, "no reservation is left to run out")
		st, err := readKeyStats(ctx, q, "t")
		require.NoError(t, err)
		assert.Zero(t, st.Dead, "no job went to the dead letters")
		assert.Zero(t, st.Jobs, "both were finished")
		var records []string
		for _, k := range keysOf(t, c) {
			if strings.Contains(k, "{"+q.opts.name+":") && strings.Contains(k, ":rsv:") {
				records = append(records, k)
			}
		}
		assert.Len(t, records, 1, "the second pop's record is written over the first's, answered after all")
	})
}

func TestAReserveWhoseReplyNeverCameIsSentAgain(t *testing.T) {
	forEachFlakyBackend(t, func(t *testing.T, c *redis.Client, d *flakyconn.Dialer) {
		ctx := context.Background()
		q := newQueue(t, c, WithBuckets(1))
		a := pushed(t, q, &Job{Topic: "t"})
		fired := d.LoseNextReply(loadedScript(t, q, scriptReserve)) // or the lost reply would be NOSCRIPT's
		job, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err, "the call is sent again, and answered")
		require.True(t, fired())
		assert.Equal(t, a, job.ID, "the job the lost run reserved")
		assert.Equal(t, 1, job.Attempts)
		require.NoError(t, q.Finish(ctx, job.ID))
		st, err := readKeyStats(ctx, q, "t")
		require.NoError(t, err)
		assert.Zero(t, st.Jobs, "no job is left reserved until its TTR")
	}, func(o *redis.Options) {
		// No retries of go-redis's own: the lost reply reaches the queue,
		// as when a partition outlasts them.
		o.MaxRetries = -1
	})
}

// A reserve call's record slot is handed out again only once the call got
// a reply: a call whose context ended, or whose connection broke, may
// still run, and would write over the record of the slot's next call.
func TestARecordSlotIsUsedAgainOnlyAfterAReply(t *testing.T) {
	q := &DelayQueue{}
	call := func(err error) *scriptCall {
		c := &scriptCall{record: q.records.take(), recorded: true, cmd: redis.NewCmd(context.Background())}
		c.cmd.SetErr(err)
		return c
	}
	ok, refused := call(nil), call(fmt.Errorf("delayqueue: %w", replyError("ERR refused")))
	cancelled, broken := call(context.Canceled), call(io.ErrUnexpectedEOF)
	q.answered([]*scriptCall{ok, refused, cancelled, broken})
	handed := map[int]bool{q.records.take(): true, q.records.take(): true}
	assert.Equal(t, map[int]bool{ok.record: true, refused.record: true}, handed, "the answered calls' slots are handed out again")
	assert.Equal(t, 4, q.records.take(), "the slots of calls without a reply are never handed out again")
}

// replyError is an error reply of the server.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// A job in its place keeps the grant recorded for its place, past a job
// settled elsewhere before the call's second run (nil), whose grant went
// with it.
func TestPlacedJobsKeepTheGrantsOfTheirPlaces(t *testing.T) {
	a, b := &Job{ID: "a"}, &Job{ID: "b"}
	jobs := placed([]*Job{nil, a, nil, b}, []string{"c:1", "c:2", "c:3", "c:4"})
	assert.Equal(t, []*Job{a, b}, jobs)
	assert.Equal(t, "c:2", a.grant)
	assert.Equal(t, "c:4", b.grant)
	c := &Job{ID: "c"}
	assert.Equal(t, []*Job{c}, placed([]*Job{c}, nil))
	assert.Empty(t, c.grant, "no grant where the call recorded none")
}
