package delayqueue

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dqueue/delayqueue/internal/flakyconn"
	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSetLimitsRefusesBadValuesAndZeroRemoves(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		before := keysOfQueues(t, be.client, q.opts.name)
		for _, l := range []Limits{
			{Concurrency: -1},
			{Rate: -1},
			{Rate: 1, Per: -time.Second},
			{Rate: 1, Per: time.Microsecond},
			{Rate: 1, Per: 1500 * time.Microsecond},
			{Rate: 1, Per: 48 * time.Hour},
			{Per: time.Second},
			{Concurrency: maxLimitConcurrency + 1},
			{Rate: maxLimitRate + 1},
		} {
			assert.ErrorIs(t, q.SetLimits(ctx, "t", l), ErrInvalidLimits, "%+v", l)
		}
		assert.ErrorIs(t, q.SetLimits(ctx, "a{b}", Limits{Concurrency: 1}), ErrInvalidTopic)
		assert.Equal(t, before, keysOfQueues(t, be.client, q.opts.name), "nothing written")

		got, err := q.Limits(ctx, "t")
		require.NoError(t, err)
		assert.Equal(t, Limits{}, got)

		require.NoError(t, q.SetLimits(ctx, "t", Limits{Concurrency: 3, Rate: 10}))
		got, err = q.Limits(ctx, "t")
		require.NoError(t, err)
		assert.Equal(t, Limits{Concurrency: 3, Rate: 10, Per: time.Second}, got, "Per defaults to a second")

		require.NoError(t, q.SetLimits(ctx, "t", Limits{}))
		got, err = q.Limits(ctx, "t")
		require.NoError(t, err)
		assert.Equal(t, Limits{}, got)
		assert.Equal(t, before, keysOfQueues(t, be.client, q.opts.name), "no limit left behind")
	})
}

func TestPopObeysConcurrencyAcrossInstances(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		a, b := twoInstances(t, be.client)
		startQueue(t, a)
		require.NoError(t, a.SetLimits(ctx, "t", Limits{Concurrency: 2}))
		for range 6 {
			pushed(t, a, &Job{Topic: "t"})
		}
		j1, err := a.Pop(ctx, "t", 0)
		require.NoError(t, err)
		j2, err := b.Pop(ctx, "t", 0)
		require.NoError(t, err)
		_, err = a.Pop(ctx, "t", 0)
		assert.ErrorIs(t, err, ErrNoJob, "two reserved: at the limit")
		_, err = b.Pop(ctx, "t", 0)
		assert.ErrorIs(t, err, ErrNoJob, "the other instance too")
		c, err := a.Counts(ctx, "t")
		require.NoError(t, err)
		assert.Equal(t, 2, c.Reserved)
		assert.Equal(t, 4, c.Ready)

		// A waiting Pop is woken when another instance finishes a job.
		got := popOneLater(b, "t", time.Minute)
		require.NoError(t, a.Finish(ctx, j1.ID))
		j3 := (<-got).job(t)
		require.NotNil(t, j3)
		_, err = a.Pop(ctx, "t", 0)
		assert.ErrorIs(t, err, ErrNoJob)

		// Retry and Release give capacity back too.
		require.NoError(t, b.Retry(ctx, j2, fmt.Errorf("boom")))
		j4, err := a.Pop(ctx, "t", 0)
		require.NoError(t, err)
		require.NoError(t, a.Release(ctx, j4))
		j5, err := a.Pop(ctx, "t", 0)
		require.NoError(t, err)

		// Raised limits take effect at once for a waiting Pop.
		got = popOneLater(a, "t", time.Minute)
		require.NoError(t, b.SetLimits(ctx, "t", Limits{Concurrency: 3}))
		require.NotNil(t, (<-got).job(t))
		// Removed limits leave the topic free.
		require.NoError(t, b.SetLimits(ctx, "t", Limits{}))
		require.Eventually(t, func() bool {
			job, err := a.Pop(ctx, "t", 0)
			return err == nil && job != nil
		}, 30*time.Second, 10*time.Millisecond)
		require.NoError(t, b.Finish(ctx, j3.ID))
		require.NoError(t, a.Finish(ctx, j5.ID))
	})
}

func TestPopObeysRate(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		a, b := twoInstances(t, be.client)
		require.NoError(t, a.SetLimits(ctx, "t", Limits{Rate: 3, Per: time.Hour}))
		for range 5 {
			pushed(t, a, &Job{Topic: "t"})
		}
		for i := range 3 {
			q := []*DelayQueue{a, b}[i%2]
			job, err := q.Pop(ctx, "t", 0)
			require.NoError(t, err)
			require.NoError(t, q.Finish(ctx, job.ID), "a finished job still counts for the rate")
		}
		_, err := a.Pop(ctx, "t", 0)
		assert.ErrorIs(t, err, ErrNoJob)
		_, err = b.Pop(ctx, "t", 0)
		assert.ErrorIs(t, err, ErrNoJob)
		u, err := a.limitUsage(ctx)
		require.NoError(t, err)
		assert.Equal(t, 3, u["t"].InWindow)
		if be.mini != nil {
			be.mini.SetTime(time.Now().Add(time.Hour + time.Second))
			job, err := b.Pop(ctx, "t", 0)
			require.NoError(t, err, "the window moved on")
			require.NoError(t, b.Finish(ctx, job.ID))
		}
	})
}

func TestCapacityOfAnAbandonedReservationComesBackAfterItsTTR(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		dead, live := twoInstances(t, be.client)
		startQueue(t, live)
		require.NoError(t, live.SetLimits(ctx, "t", Limits{Concurrency: 1}))
		pushed(t, live, &Job{Topic: "t", TTR: 300 * time.Millisecond})
		pushed(t, live, &Job{Topic: "t", TTR: 300 * time.Millisecond})
		_, err := dead.Pop(ctx, "t", 0) // and never settled: its process died
		require.NoError(t, err)
		_, err = live.Pop(ctx, "t", 0)
		require.ErrorIs(t, err, ErrNoJob)
		if be.mini != nil {
			be.mini.SetTime(time.Now().Add(2 * time.Second))
		}
		job, err := live.Pop(ctx, "t", time.Minute)
		require.NoError(t, err)
		require.NoError(t, live.Finish(ctx, job.ID))
	})
}

// TestConsumersNeverExceedTheLimits runs several instances' Consume on a
// topic whose jobs sit in every bucket (on a Cluster, on every master);
// the handlers count themselves how many run at once.
func TestConsumersNeverExceedTheLimits(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) { consumersNeverExceed(t, be.client) })
}

// Through Sentinel the limiter's keys live on the primary that the
// failover client finds; nothing else changes.
func TestConsumersNeverExceedTheLimitsThroughSentinel(t *testing.T) {
	s := redistest.StartSentinels(t)
	fc := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: s.SentinelAddrs()})
	t.Cleanup(func() { _ = fc.Close() })
	consumersNeverExceed(t, fc)
}

// consumersNeverExceed has three instances Consume a topic limited to 3
// running, each with room for 4, and checks the most running at once.
func consumersNeverExceed(t *testing.T, client redis.UniversalClient) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	name := uniqueName(t)
	const conc, jobs = 3, 60
	var qs []*DelayQueue
	for range 3 {
		q := newQueue(t, client, WithName(name))
		startQueue(t, q)
		qs = append(qs, q)
	}
	require.NoError(t, qs[0].SetLimits(ctx, "t", Limits{Concurrency: conc}))
	for i := range jobs {
		// IDs of the caller's spread by their hash over every bucket
		// (generated ones fill one bucket at a time).
		pushed(t, qs[0], &Job{ID: fmt.Sprintf("j%d", i), Topic: "t"})
	}
	var running, most, done atomic.Int64
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // after ctx's cancel: no Consume asserts once the test ended
	for _, q := range qs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.NoError(t, q.Consume(ctx, "t", func(ctx context.Context, job *Job) error {
				n := running.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(2 * time.Millisecond) // the work
				running.Add(-1)
				done.Add(1)
				return nil
			}, ConsumeOptions{Concurrency: 4}))
		}()
	}
	require.Eventually(t, func() bool { return done.Load() == jobs }, time.Minute, 10*time.Millisecond)
	cancel()
	wg.Wait()
	assert.LessOrEqual(t, most.Load(), int64(conc))
	assert.Positive(t, most.Load())
}

// TestConsumersNeverExceedTheRate checks every window of Per over the
// reservations' start times, on the server's clock, less a margin: a grant
// is counted when taken, a moment before the reservation it covers.
func TestConsumersNeverExceedTheRate(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		if be.mini != nil {
			t.Skip("miniredis's clock stands still unless moved; TestPopObeysRate covers it")
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		name := uniqueName(t)
		const rate, per, jobs = 5, 500 * time.Millisecond, 20
		var qs []*DelayQueue
		for range 3 {
			q := newQueue(t, be.client, WithName(name))
			startQueue(t, q)
			qs = append(qs, q)
		}
		require.NoError(t, qs[0].SetLimits(ctx, "t", Limits{Rate: rate, Per: per}))
		for range jobs {
			pushed(t, qs[0], &Job{Topic: "t"})
		}
		var mu sync.Mutex
		var starts []time.Time
		var wg sync.WaitGroup
		t.Cleanup(wg.Wait) // after ctx's cancel: no Consume asserts once the test ended
		for _, q := range qs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				assert.NoError(t, q.Consume(ctx, "t", func(ctx context.Context, job *Job) error {
					mu.Lock()
					defer mu.Unlock()
					starts = append(starts, job.ReservedUntil.Add(-job.TTR))
					return nil
				}, ConsumeOptions{Concurrency: 4}))
			}()
		}
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(starts) == jobs
		}, time.Minute, 10*time.Millisecond)
		cancel()
		wg.Wait()
		slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
		window := per - 50*time.Millisecond
		for i := range starts {
			n := 0
			for j := i; j < len(starts) && starts[j].Sub(starts[i]) < window; j++ {
				n++
			}
			assert.LessOrEqual(t, n, rate, "reservations within %v from the %d-th", window, i)
		}
	})
}

// limitedHandler is the handler of the "limited" helper processes: it
// counts the handlers running in every process in Redis (name:running),
// records each count it saw (name:seen) and the jobs done (name:done).
func limitedHandler(c redis.UniversalClient, name string) Handler {
	return func(ctx context.Context, job *Job) error {
		n, err := c.Incr(ctx, name+":running").Result()
		if err != nil {
			return err
		}
		defer c.Decr(context.WithoutCancel(ctx), name+":running")
		c.RPush(ctx, name+":seen", n)
		time.Sleep(5 * time.Millisecond) // the work
		c.Incr(ctx, name+":done")
		return nil
	}
}

// TestProcessesNeverExceedConcurrencyAndAKilledOnesCapacityComesBack: a
// process holding two of three grants is killed; three others consume the
// backlog, counting in Redis how many handlers run at once.
func TestProcessesNeverExceedConcurrencyAndAKilledOnesCapacityComesBack(t *testing.T) {
	s, name, q := startedQueue(t)
	c := s.Client(t)
	ctx := context.Background()
	const conc, n = 3, 200
	require.NoError(t, q.SetLimits(ctx, "t", Limits{Concurrency: conc}))
	pushN(t, q, n, func(int) *Job { return &Job{Topic: "t", TTR: time.Second} })
	holder := startChild(t, "hold", s.Addr, name, "DQ_N=2")
	holder.expect(t, "held 2")
	holder.signal(t, syscall.SIGKILL)
	for range 3 {
		startChild(t, "limited", s.Addr, name).expect(t, "started")
	}
	require.Eventually(t, func() bool {
		done, _ := c.Get(ctx, name+":done").Int()
		return done >= n
	}, 2*time.Minute, 20*time.Millisecond, "every job done, the killed process's two among them")
	seen, err := c.LRange(ctx, name+":seen", 0, -1).Result()
	require.NoError(t, err)
	most := 0
	for _, v := range seen {
		k, err := strconv.Atoi(v)
		require.NoError(t, err)
		most = max(most, k)
	}
	t.Logf("at most %d handlers ran at once, of %d runs", most, len(seen))
	assert.LessOrEqual(t, most, conc)
	assert.GreaterOrEqual(t, len(seen), n)
}

// TestLoweredLimitsHoldForAGrantHandedOver: a job settled in the process
// of a waiting Pop hands its grant over, but a grant over lowered limits is
// not renewed: the waiting Pop gets a job only once capacity is free.
func TestLoweredLimitsHoldForAGrantHandedOver(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		a, b := twoInstances(t, be.client)
		require.NoError(t, a.SetLimits(ctx, "t", Limits{Concurrency: 2}))
		for range 4 {
			pushed(t, a, &Job{Topic: "t"})
		}
		j1, err := a.Pop(ctx, "t", 0)
		require.NoError(t, err)
		j2, err := a.Pop(ctx, "t", 0)
		require.NoError(t, err)
		got := popAtTheLimit(t, a)
		require.NoError(t, b.SetLimits(ctx, "t", Limits{Concurrency: 1}))
		require.NoError(t, a.Finish(ctx, j1.ID)) // its grant goes to the waiting Pop, which cannot renew it
		_, err = b.Pop(ctx, "t", 0)
		assert.ErrorIs(t, err, ErrNoJob, "j2 holds the one grant")
		require.NoError(t, a.Finish(ctx, j2.ID))
		j3 := (<-got).job(t)
		require.NotNil(t, j3)
		u, err := a.limitUsage(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, u["t"].Running)
		c, err := a.Counts(ctx, "t")
		require.NoError(t, err)
		assert.Equal(t, 1, c.Reserved)
		require.NoError(t, a.Finish(ctx, j3.ID))
	})
}

// twoInstances opens one queue twice, as two processes would.
func twoInstances(t *testing.T, c redis.UniversalClient) (*DelayQueue, *DelayQueue) {
	name := uniqueName(t)
	return newQueue(t, c, WithName(name)), newQueue(t, c, WithName(name))
}

// A job's slot is free once the job is finished or removed, whichever
// process does it: its grant is recorded beside it, not only in the
// process that reserved it. Its reservation (an hour) is far from over.
func TestAnyProcessThatSettlesAJobFreesItsSlot(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		a, b := oneSlot(t, be, 4)
		pop := func(q *DelayQueue) *Job {
			t.Helper()
			job, err := q.Pop(ctx, "t", 0)
			require.NoError(t, err)
			return job
		}
		atLimit := func(q *DelayQueue, why string) {
			t.Helper()
			_, err := q.Pop(ctx, "t", 0)
			require.ErrorIs(t, err, ErrNoJob, why)
		}

		j1 := pop(a)
		atLimit(b, "one reserved: at the limit")
		require.NoError(t, b.Finish(ctx, j1.ID), "finished by ID where it was not popped")
		j2 := pop(b)
		atLimit(a, "j2 holds the slot")
		require.NoError(t, a.Remove(ctx, j2.ID), "removed where it was not popped")
		j3 := pop(a)
		require.NoError(t, a.Remove(ctx, j3.ID), "removed where it was popped")
		j4 := pop(b)
		assert.ErrorIs(t, a.Finish(ctx, j1.ID), ErrNotFound, "settled elsewhere")
		atLimit(a, "a late Finish of a job settled elsewhere frees no other job's slot")
		require.NoError(t, b.Finish(ctx, j4.ID))
		for _, k := range keysOf(t, be.client) {
			if strings.HasPrefix(k, "dq:{"+a.opts.name+":") {
				assert.NotContains(t, k, ":grant:", "the grants recorded went with their jobs")
			}
		}
	})
}

// A reserve call sent again after its reply was lost answers with the
// jobs its first run reserved, in their places: a job another process
// settled in between keeps its place, empty, and the job after it holds
// the grant recorded for it. Answered in a row, the job left would be
// bound to the settled job's grant, which the settler gave back, and its
// own grant given back as unused: it would run uncounted.
func TestAReserveSentAgainBindsEachJobTheGrantRecordedForIt(t *testing.T) {
	forEachFlakyBackend(t, func(t *testing.T, c *redis.Client, d *flakyconn.Dialer) {
		ctx := context.Background()
		a, b := twoInstances(t, c)
		require.NoError(t, a.SetLimits(ctx, "t", Limits{Concurrency: 2}))
		first := pushed(t, a, &Job{Topic: "t", TTR: time.Hour})
		second := pushed(t, a, &Job{Topic: "t", TTR: time.Hour})
		fired, release := d.LoseNextReplyThenHold(loadedScript(t, a, scriptReserve))
		popped := popLater(a, 2)
		require.Eventually(t, fired, time.Minute, time.Millisecond, "the first run reserves both jobs")
		require.NoError(t, b.Remove(ctx, first), "settled elsewhere before the call is sent again")
		release()
		jobs := (<-popped).jobs(t)
		require.Len(t, jobs, 1)
		assert.Equal(t, second, jobs[0].ID)
		running := func() int {
			t.Helper()
			u, err := b.limitUsage(ctx)
			require.NoError(t, err)
			return u["t"].Running
		}
		assert.Equal(t, 1, running(), "the job left holds a slot")
		require.NoError(t, a.Finish(ctx, jobs[0].ID))
		assert.Equal(t, 0, running(), "its finish frees the slot it held")
	}, resentByTheQueue)
}

// The same after a hole: the next look of the pop reserves no more jobs
// than grants are left, places counted, not jobs; with more, the job of a
// place past the grants would run uncounted.
func TestAPopAfterAReserveSentAgainReservesNoMoreThanItsGrants(t *testing.T) {
	forEachFlakyBackend(t, func(t *testing.T, c *redis.Client, d *flakyconn.Dialer) {
		ctx := context.Background()
		name := uniqueName(t)
		a, b := newQueue(t, c, WithName(name), WithBuckets(2)), newQueue(t, c, WithName(name), WithBuckets(2))
		require.NoError(t, a.SetLimits(ctx, "t", Limits{Concurrency: 3}))
		var in [2][]string // three jobs in each bucket
		for len(in[0]) < 3 || len(in[1]) < 3 {
			id := pushed(t, a, &Job{Topic: "t", TTR: time.Hour})
			in[bucketOf(id, 2)] = append(in[bucketOf(id, 2)], id)
		}
		fired, release := d.LoseNextReplyThenHold(loadedScript(t, a, scriptReserve))
		popped := popLater(a, 3) // looks at one bucket, then the other
		require.Eventually(t, fired, time.Minute, time.Millisecond, "the first look reserves three jobs of a bucket")
		var first string
		for _, ids := range in {
			job, err := b.Get(ctx, ids[0])
			require.NoError(t, err)
			if job.State == StateReserved {
				first = job.ID
			}
		}
		require.NotEmpty(t, first)
		require.NoError(t, b.Remove(ctx, first), "settled elsewhere before the call is sent again")
		release()
		require.Len(t, (<-popped).jobs(t), 2, "no job for the place that went with the removed job")
		u, err := b.limitUsage(ctx)
		require.NoError(t, err)
		assert.Equal(t, 2, u["t"].Running, "each job held counts")
		_, err = b.Pop(ctx, "t", 0)
		assert.NoError(t, err, "the third slot is free")
		_, err = b.Pop(ctx, "t", 0)
		assert.ErrorIs(t, err, ErrNoJob, "a limit of 3: no fourth job runs")
	}, resentByTheQueue)
}

// A hand-on whose next job another process settled between the reserve
// call's first run and its second gives the grant back, and reports the
// reply's hole to the observers as no job.
func TestAHandOnWhoseNextJobWasSettledElsewhereGivesItsGrantBack(t *testing.T) {
	forEachFlakyBackend(t, func(t *testing.T, c *redis.Client, d *flakyconn.Dialer) {
		ctx := context.Background()
		name := uniqueName(t)
		var reserved atomic.Int32
		a := newQueue(t, c, WithName(name), WithBuckets(1), WithObserver(ObserverFunc(func(_ context.Context, e Event) {
			if e.Kind == EventReserved {
				reserved.Add(1)
			}
		})))
		b := newQueue(t, c, WithName(name), WithBuckets(1))
		require.NoError(t, a.SetLimits(ctx, "t", Limits{Concurrency: 1}))
		pushed(t, a, &Job{Topic: "t", TTR: time.Hour})
		second := pushed(t, a, &Job{Topic: "t", TTR: time.Hour})
		jobs, err := a.pop(ctx, "t", 1, 0)
		require.NoError(t, err)
		require.Len(t, jobs, 1)
		fired, release := d.LoseNextReplyThenHold(loadedScript(t, a, scriptReserve))
		type handedOn struct {
			next *Job
			err  error
		}
		done := make(chan handedOn, 1)
		go func() {
			next, err := a.finishHandOn(ctx, jobs[0])
			done <- handedOn{next, err}
		}()
		require.Eventually(t, fired, time.Minute, time.Millisecond, "the first run finishes the job and reserves the next")
		require.NoError(t, b.Remove(ctx, second), "settled elsewhere before the call is sent again")
		release()
		h := <-done
		require.NoError(t, h.err, "the finish took effect")
		assert.Nil(t, h.next, "no next job: it is gone")
		assert.EqualValues(t, 1, reserved.Load(), "the first pop's job alone was reported reserved")
		u, err := b.limitUsage(ctx)
		require.NoError(t, err)
		assert.Zero(t, u["t"].Running, "the slot is free")
	}, resentByTheQueue)
}

// resentByTheQueue sets a client up for LoseNextReplyThenHold: the queue,
// not go-redis, sends a call again whose reply was lost, and the call sent
// again waits for the release.
func resentByTheQueue(o *redis.Options) {
	o.MaxRetries = -1
	o.WriteTimeout = time.Minute
}

// Touch extends what a job's grant is recorded for with its reservation.
func TestTouchKeepsAJobsGrantRecorded(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		a, b := oneSlot(t, be, 2)
		job, err := a.Pop(ctx, "t", 0)
		require.NoError(t, err)
		key := a.keys.bucket(bucketOf(job.ID, a.opts.buckets)).grants + job.ID
		// As if the first hour had nearly passed.
		require.NoError(t, be.client.PExpire(ctx, key, time.Second).Err())
		require.NoError(t, a.Touch(ctx, job))
		ttl, err := be.client.PTTL(ctx, key).Result()
		require.NoError(t, err)
		assert.Greater(t, ttl, 59*time.Minute, "recorded as long as the reservation lasts")
		require.NoError(t, b.Finish(ctx, job.ID))
		_, err = b.Pop(ctx, "t", 0)
		assert.NoError(t, err, "the slot came free")
	})
}

// A Consume handler's job that another process finished meanwhile does
// not hand its grant on to the next job: that process gives the grant
// back, maybe only once the next job runs, which would then not count.
// Here the other process's give-back waits until the consumer's next job
// runs: that job must hold a slot of its own.
func TestAGrantGivenBackElsewhereIsNotHandedOn(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		a, b := oneSlot(t, be, 3)
		startQueue(t, a)
		first, next := make(chan *Job, 1), make(chan *Job, 3)
		proceed, hold := make(chan struct{}), make(chan struct{})
		var calls atomic.Int32
		consumed := make(chan error, 1)
		go func() {
			consumed <- a.Consume(ctx, "t", func(_ context.Context, job *Job) error {
				if calls.Add(1) == 1 {
					first <- job
					<-proceed
					return nil
				}
				next <- job
				<-hold // holds its slot
				return nil
			}, ConsumeOptions{Concurrency: 1})
		}()
		job := <-first
		grant := finishHoldingItsGrant(t, b, job.ID)
		close(proceed)
		<-next
		b.giveBackNow(ctx, &giveBack{topic: "t", settled: []string{grant}})
		_, err := b.Pop(ctx, "t", 0)
		assert.ErrorIs(t, err, ErrNoJob, "the running job holds the only slot")
		cancel()
		close(hold)
		require.NoError(t, <-consumed)
	})
}

// Nor does a popped job's Finish that finds it settled elsewhere hand its
// grant over to a Pop of the process that waits at the limit.
func TestAGrantGivenBackElsewhereIsNotHandedOver(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		a, b := oneSlot(t, be, 3)
		job, err := a.Pop(ctx, "t", 0)
		require.NoError(t, err)
		got := popAtTheLimit(t, a)
		grant := finishHoldingItsGrant(t, b, job.ID)
		assert.ErrorIs(t, a.Finish(ctx, job.ID), ErrNotFound)
		next := (<-got).job(t)
		require.NotNil(t, next)
		b.giveBackNow(ctx, &giveBack{topic: "t", settled: []string{grant}})
		_, err = b.Pop(ctx, "t", 0)
		assert.ErrorIs(t, err, ErrNoJob, "the job a popped holds the only slot")
		require.NoError(t, a.Finish(ctx, next.ID))
	})
}

// finishHoldingItsGrant finishes job id as finish.lua does for a process
// that did not reserve it, and returns the job's grant, which the caller
// gives back when it pleases.
func finishHoldingItsGrant(t *testing.T, q *DelayQueue, id string) string {
	t.Helper()
	bk := q.keys.bucket(bucketOf(id, q.opts.buckets))
	call := &scriptCall{script: scriptFinish, keys: bk.finishKeys(), args: []any{id, "", ""}}
	q.sendCalls(context.Background(), []*scriptCall{call})
	res, err := call.cmd.Slice()
	require.NoError(t, err)
	require.Len(t, res, 4, "finished, with its grant")
	require.Equal(t, int64(finishDone), res[0])
	grant, _ := res[3].(string)
	require.NotEmpty(t, grant)
	return grant
}

// popAtTheLimit pops a job of topic "t" from q in the background, once
// that Pop waits at the topic's limit.
func popAtTheLimit(t *testing.T, q *DelayQueue) <-chan popped {
	t.Helper()
	got := popOneLater(q, "t", time.Minute)
	var early *popped // a Pop that returned before it waited
	require.Eventually(t, func() bool {
		select {
		case p := <-got:
			early = &p
			return true
		default:
		}
		q.limiter.mu.Lock()
		defer q.limiter.mu.Unlock()
		return len(q.limiter.waiting["t"]) == 1
	}, 30*time.Second, time.Millisecond, "the Pop waits at the limit")
	if early != nil {
		require.NoError(t, early.err, "the Pop ended before it waited at the limit")
		require.FailNow(t, "the Pop got a job before it waited at the limit")
	}
	return got
}

// oneSlot is two instances of one queue whose topic "t" has a concurrency
// limit of 1 and jobs ready jobs, each with a TTR of an hour.
func oneSlot(t *testing.T, be backend, jobs int) (*DelayQueue, *DelayQueue) {
	t.Helper()
	a, b := twoInstances(t, be.client)
	require.NoError(t, a.SetLimits(context.Background(), "t", Limits{Concurrency: 1}))
	for range jobs {
		pushed(t, a, &Job{Topic: "t", TTR: time.Hour})
	}
	return a, b
}

// An Upsert of a reserved job ends its reservation, and frees its slot.
func TestUpsertOfAReservedJobFreesItsSlot(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		a, b := oneSlot(t, be, 0)
		pushed(t, a, &Job{ID: "u", Topic: "t", TTR: time.Hour})
		job, err := a.Pop(ctx, "t", 0)
		require.NoError(t, err)
		_, err = b.Upsert(ctx, &Job{ID: "u", Topic: "t", TTR: time.Hour})
		require.NoError(t, err)
		again, err := b.Pop(ctx, "t", 0)
		require.NoError(t, err, "the slot came free")
		assert.Equal(t, job.ID, again.ID)
		assert.ErrorIs(t, a.Finish(ctx, job.ID), ErrReservationLost)
		require.NoError(t, b.Finish(ctx, again.ID))
	})
}

// Overview counts a topic's limits in use on the server's clock, which the
// grants are on, whatever the caller's clock says.
func TestLimitUsageIsReadOnTheServersClock(t *testing.T) {
	ctx := context.Background()
	q, _, _, _ := clockQueue(t) // the server's clock is years behind
	require.NoError(t, q.SetLimits(ctx, "t", Limits{Concurrency: 2, Rate: 10}))
	pushed(t, q, &Job{Topic: "t", TTR: 2 * time.Second})
	_, err := q.Pop(ctx, "t", 0)
	require.NoError(t, err)
	o, err := q.Overview(ctx)
	require.NoError(t, err)
	u := o.Limits["t"]
	assert.Equal(t, 1, u.Running)
	assert.Equal(t, 1, u.InWindow)
}

// Grants given back together wake as many consumers waiting at the limit,
// however many: none waits for its blocked call's end.
func TestManyGrantsGivenBackWakeAsManyWaiters(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		const n = 24
		a, b := twoInstances(t, be.client)
		require.NoError(t, a.SetLimits(ctx, "t", Limits{Concurrency: n}))
		for range 2 * n {
			pushed(t, a, &Job{Topic: "t", TTR: time.Hour})
		}
		var held []*Job
		for range n {
			job, err := a.Pop(ctx, "t", 0)
			require.NoError(t, err)
			held = append(held, job)
		}
		got := make(chan error, n)
		for range n {
			go func() {
				_, err := b.Pop(ctx, "t", 10*time.Second) // under a blocked call's 20 s
				got <- err
			}()
		}
		require.Eventually(t, func() bool {
			b.limiter.mu.Lock()
			defer b.limiter.mu.Unlock()
			return len(b.limiter.waiting["t"]) == n
		}, 30*time.Second, time.Millisecond, "every Pop waits at the limit")
		// Finished together: their grants go back in one call.
		gb := &giveBack{topic: "t"}
		for _, job := range held {
			require.NoError(t, a.finishWithin(ctx, job.ID, job.reservation, "t", true, 0, 0))
			gb.settled = append(gb.settled, job.grant)
		}
		a.giveBackNow(ctx, gb)
		for range n {
			assert.NoError(t, <-got)
		}
	})
}

// A reservation whose deadline passed is not extended, even while the job
// waits to be moved back: its grant may be another consumer's by then.
func TestTouchRefusesAReservationThatRanOut(t *testing.T) {
	ctx := context.Background()
	q, _, _, advance := clockQueue(t)
	pushed(t, q, &Job{Topic: "t", TTR: time.Second})
	job, err := q.Pop(ctx, "t", 0)
	require.NoError(t, err)
	advance(1500 * time.Millisecond) // no started process moves it back
	assert.ErrorIs(t, q.Touch(ctx, job), ErrReservationLost)
}

// A grant lasts, before it is bound to a job, as long as the longest TTR
// of the topic's jobs the process has seen, not the queue's default TTR
// when that is longer: a process that dies between the two holds no slot
// longer than its jobs would.
func TestAGrantBeforeItsJobLastsTheTopicsTTR(t *testing.T) {
	var lm limiter
	assert.Equal(t, time.Minute, lm.hold("t", time.Minute), "the default before any job")
	lm.sawTTR("t", 5*time.Second)
	lm.sawTTR("t", 2*time.Second)
	assert.Equal(t, 5*time.Second, lm.hold("t", time.Minute))
}

// A grant a process gives back for a job another process reserved goes
// back to Redis, not to a consumer of its own that waits at the limit:
// the reserving process still holds the grant's name, and gives it back
// when it finds the job gone, which would free the slot of the job run
// with it.
func TestARecordedGrantIsNotHandedOverLocally(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		a, b := oneSlot(t, be, 3)
		j1, err := a.Pop(ctx, "t", 0)
		require.NoError(t, err)
		got := popAtTheLimit(t, b)
		require.NoError(t, b.Finish(ctx, j1.ID), "finished where it was not popped")
		j2 := (<-got).job(t)
		require.NotNil(t, j2)
		assert.ErrorIs(t, a.Finish(ctx, j1.ID), ErrNotFound)
		_, err = a.Pop(ctx, "t", 0)
		assert.ErrorIs(t, err, ErrNoJob, "j2 holds the only slot")
		require.NoError(t, b.Finish(ctx, j2.ID))
	})
}
