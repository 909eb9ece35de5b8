package delayqueue

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// waitersOf counts the consumers of q waiting for topic.
func waitersOf(q *DelayQueue, topic string) int {
	q.mu.Lock()
	w := q.waits
	q.mu.Unlock()
	if w == nil {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if tw := w.topics[topic]; tw != nil {
		return len(tw.waiters)
	}
	return 0
}

// blockedFor reports whether every blocked call of q waits for topic.
func blockedFor(q *DelayQueue, topic string) bool {
	q.mu.Lock()
	w := q.waits
	q.mu.Unlock()
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, g := range w.groups {
		if g.keys == nil || !g.waitsFor(topic) {
			return false
		}
	}
	return true
}

// idleWaits is a process's waits with no blocked call running, for tests
// that drive its bookkeeping by hand; it closes with the test.
func idleWaits(t *testing.T, q *DelayQueue) *waits {
	w := &waits{q: q, token: "test", topics: map[string]*topicWait{}}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	t.Cleanup(w.cancel)
	return w
}

// allBlockedFor returns a condition: every blocked call of each of qs
// waits for topic.
func allBlockedFor(qs []*DelayQueue, topic string) func() bool {
	return func() bool {
		for _, q := range qs {
			if !blockedFor(q, topic) {
				return false
			}
		}
		return true
	}
}

// reserveCounter counts the reserve calls a client sends, those that found
// no job and those that reserved one, and the finishes they carried; and
// the looks for a lost signal, and of those the ones that looked at the
// list.
type reserveCounter struct {
	calls, empty, found atomic.Int64 // found: calls that reserved a job
	rode                atomic.Int64 // finishes carried (reserve.lua's ARGV[10])
	lost, lostLooked    atomic.Int64 // reserveLost calls; those not answered reserveUnclaimed
}

func (r *reserveCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *reserveCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		r.count(cmd)
		return err
	}
}

func (r *reserveCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			r.count(cmd)
		}
		return err
	}
}

// isReserveCall reports whether cmd runs reserve.lua.
func isReserveCall(cmd redis.Cmder) bool {
	return runsScript(cmd, scriptReserve)
}

func (r *reserveCounter) count(cmd redis.Cmder) {
	if !isReserveCall(cmd) {
		return
	}
	c, ok := cmd.(*redis.Cmd)
	if !ok || c.Err() != nil {
		return
	}
	r.calls.Add(1)
	reply, _ := c.Val().([]any)
	if args := c.Args(); len(args) > 2 {
		if keys, err := strconv.Atoi(fmt.Sprint(args[2])); err == nil && len(args) > 3+keys+9 {
			if f, err := strconv.Atoi(fmt.Sprint(args[3+keys+9])); err == nil {
				r.rode.Add(int64(f))
			}
			if fmt.Sprint(args[3+keys+7]) == strconv.Itoa(int(reserveLost)) {
				r.lost.Add(1)
				if len(reply) > 0 && reply[0] != int64(reserveUnclaimed) {
					r.lostLooked.Add(1)
				}
			}
		}
	}
	if len(reply) <= 3 { // status, signals left, signals given: no job
		r.empty.Add(1)
	} else {
		r.found.Add(1)
	}
}

// A job made ready wakes one waiting consumer, whichever process it is in:
// with eight processes' consumers waiting, each job costs one reserve call,
// and no call finds nothing (the herd that a broadcast wake-up makes).
func TestAReadyJobWakesOneConsumerNotAll(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		const processes, jobs = 8, 40
		name := uniqueName(t)
		producer := newQueue(t, be.client, WithName(name))
		counter := &reserveCounter{}
		var consumers []*DelayQueue
		for range processes { // each with a client of its own, as a process has
			c := anotherClient(t, be.client)
			c.AddHook(counter)
			consumers = append(consumers, newQueue(t, c, WithName(name)))
		}
		got := make(chan string, jobs)
		var wg sync.WaitGroup
		for _, q := range consumers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					job, err := q.Pop(ctx, "t", time.Minute)
					if err != nil {
						continue
					}
					assert.NoError(t, q.Finish(ctx, job.ID))
					got <- job.ID
				}
			}()
		}
		waiting := allBlockedFor(consumers, "t")
		for _, q := range consumers {
			subscribed(t, q, "t") // the looks that the confirmations bring are over
		}
		require.Eventually(t, waiting, 30*time.Second, time.Millisecond, "every consumer waits")
		calls, empty := counter.calls.Load(), counter.empty.Load()
		for i := range jobs {
			id := pushed(t, producer, &Job{Topic: "t"})
			select {
			case delivered := <-got:
				require.Equal(t, id, delivered)
			case <-time.After(30 * time.Second):
				t.Fatalf("job %d never came", i)
			}
			require.Eventually(t, waiting, 30*time.Second, time.Millisecond)
		}
		cancel()
		wg.Wait()
		assert.Equal(t, int64(jobs), counter.calls.Load()-calls, "one reserve call per job")
		assert.Zero(t, counter.empty.Load()-empty, "no reserve call found nothing")
	})
}

// Consumers that start together on an empty queue each plan a look at
// every bucket, whose signals are not known yet; the first replies tell the
// rest where nothing waits, and their looks there are not sent: far fewer
// reserve calls than a look per consumer per bucket.
func TestConsumersThatStartTogetherDoNotEachLookAtEveryBucket(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		const consumers, buckets = 16, 8
		c := anotherClient(t, be.client)
		counter := &reserveCounter{}
		c.AddHook(counter)
		q := newQueue(t, c, WithBuckets(buckets))
		w, err := q.waiting()
		require.NoError(t, err)
		var wg sync.WaitGroup
		for range consumers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := q.Pop(ctx, "t", time.Minute)
				assert.ErrorIs(t, err, context.Canceled)
			}()
		}
		require.Eventually(t, func() bool {
			w.mu.Lock()
			defer w.mu.Unlock()
			tw := w.topics["t"]
			return tw != nil && len(tw.waiters) == consumers
		}, 30*time.Second, time.Millisecond, "every consumer waits")
		assert.Less(t, counter.calls.Load(), int64(consumers*buckets/2), "a look per consumer per bucket would be %d", consumers*buckets)
		cancel()
		wg.Wait()
	})
}

// A look that holds no signal is not sent when a reply since its plan
// said the bucket has no signal left and no job left without one; it is
// sent when the reply said jobs are left without a signal (one may have
// been lost), or when no reply came.
func TestALookIsNotSentWhereAReplySinceSaidNothingWaits(t *testing.T) {
	w := idleWaits(t, newQueue(t, miniredisClient(t), WithBuckets(3)))
	looks := w.plan("t", 1, 0, false)
	require.Len(t, looks, 3, "a look at every bucket, none known")
	w.settle("t", 0, reserveDry, reserveRanOut, 0)
	w.settle("t", 1, reserveNoSignal, reserveRanOut, 0)
	assert.True(t, w.outdated("t", looks[0]), "the list ran dry")
	assert.False(t, w.outdated("t", looks[1]), "jobs are left without a signal")
	assert.False(t, w.outdated("t", looks[2]), "no reply since")

	w.settle("t", 0, 2, reserveFilled, 0)
	claims := w.plan("t", 2, 0, false)
	require.Equal(t, look{b: 0, n: 2, claim: true, said: 2}, claims[0])
	assert.False(t, w.outdated("t", claims[0]), "no reply since: the signals are this look's")
	w.settle("t", 0, reserveDry, reserveUnclaimed, 0)
	assert.True(t, w.outdated("t", claims[0]), "another process took them, and the list ran dry")
	w.settle("t", 0, 1, reserveFilled, 0)
	claims = w.plan("t", 1, 0, false)
	w.settle("t", 0, reserveNoSignal, reserveUnclaimed, 0)
	assert.False(t, w.outdated("t", claims[0]), "jobs are left without a signal: one may have been lost")
	assert.False(t, w.outdated("t", look{b: 0, n: 1, held: 1}), "a look with a signal is sent")
}

// A reply that says a topic is paused, from a call sent before this
// process heard the topic resumed, does not pause it again: its consumers
// would wait, with no blocked call for the topic, until the next resume.
// A reply from a call sent after the resume still pauses it.
func TestAReplySentBeforeAResumeDoesNotPauseTheTopicAgain(t *testing.T) {
	w := idleWaits(t, newQueue(t, miniredisClient(t), WithBuckets(2)))
	w.settle("t", 1, 0, reservePaused, w.resumed("t"))
	require.Empty(t, w.plan("t", 1, 0, false), "paused: no look")
	before := w.resumed("t")
	w.resume("t")
	assert.True(t, w.settle("t", 0, 0, reservePaused, before), "the caller looks again")
	assert.NotEmpty(t, w.plan("t", 1, 0, false), "resumed: consumers look")

	after := w.resumed("t")
	assert.False(t, w.settle("t", 1, 0, reservePaused, after))
	assert.Empty(t, w.plan("t", 1, 0, false), "paused again after the resume")
}

// What a process hears on its control channel never pauses a topic: a
// pause told by one process while another resumed the topic may arrive
// after the resume. Nor does a call's reply that says paused, sent before
// a resubscription, after which the process cannot know what resumes it
// missed.
func TestOnlyAReplySentSinceTheLastResumePausesATopic(t *testing.T) {
	ctx := context.Background()
	q := newQueue(t, miniredisClient(t), WithBuckets(1))
	w, err := q.waiting()
	require.NoError(t, err)
	id := pushed(t, q, &Job{Topic: "t"})
	q.control(controlResume + "t")
	q.control("pause:t") // as a process of an earlier version tells it
	assert.NotEmpty(t, w.plan("t", 1, 0, false), "a told pause does not pause")

	before := w.resumed("t")
	q.control("") // resubscribed
	w.settle("t", 0, 0, reservePaused, before)
	job, err := q.Pop(ctx, "t", 0)
	require.NoError(t, err)
	assert.Equal(t, id, job.ID)
}

// Jobs made ready together go to one waiting Consume, as many as it has
// handlers free, in one reserve call: not a job to each of as many
// processes, each paying a reserve call for one job.
func TestABurstOfJobsGoesToOneConsumeInOneReserveCall(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		if be.mini != nil {
			t.Skip("miniredis has no BLMPOP: a blocked call takes one signal")
		}
		// With 8 buckets a Cluster process has a blocked call per bucket;
		// the burst's generated IDs share one bucket.
		for _, buckets := range []int{1, 8} {
			t.Run(fmt.Sprintf("%d buckets", buckets), func(t *testing.T) {
				burstToOneConsume(t, be, buckets)
			})
		}
	})
}

// burstToOneConsume pushes a burst of jobs to 4 waiting Consume instances
// of a queue of the given buckets, and checks that one reserve call took
// them all.
func burstToOneConsume(t *testing.T, be backend, buckets int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const processes, jobs = 4, 8
	name := uniqueName(t)
	producer := newQueue(t, be.client, WithName(name), WithBuckets(buckets))
	counter := &reserveCounter{}
	got := make(chan string, jobs)
	release := make(chan struct{})
	handler := func(_ context.Context, job *Job) error {
		got <- job.ID
		<-release
		return nil
	}
	var consumers []*DelayQueue
	errs := make(chan error, processes)
	for range processes {
		c := anotherClient(t, be.client)
		c.AddHook(counter)
		q := newQueue(t, c, WithName(name), WithBuckets(buckets))
		consumers = append(consumers, q)
		go func() { errs <- q.Consume(ctx, "t", handler, ConsumeOptions{Concurrency: 16, Grace: time.Minute}) }()
	}
	for _, q := range consumers {
		subscribed(t, q, "t") // the looks that the confirmations bring are over
	}
	require.Eventually(t, allBlockedFor(consumers, "t"), 30*time.Second, time.Millisecond, "every consumer waits")
	calls, empty := counter.calls.Load(), counter.empty.Load()
	burst := make([]*Job, jobs)
	for i := range burst {
		burst[i] = &Job{Topic: "t"}
	}
	_, err := producer.PushMany(ctx, burst)
	require.NoError(t, err)
	for i := range jobs {
		select {
		case <-got:
		case <-time.After(30 * time.Second):
			t.Fatalf("job %d never came", i)
		}
	}
	assert.Equal(t, int64(1), counter.calls.Load()-calls, "one reserve call for the burst")
	assert.Zero(t, counter.empty.Load()-empty, "no reserve call found nothing")
	close(release)
	cancel()
	for range processes {
		assert.NoError(t, <-errs)
	}
}

// Signals a consumer took for a reserve call that failed go on to another
// consumer (here, back to Redis once no consumer of the process came for
// them): a signal lost would leave its job waiting for a look.
func TestTheSignalsOfAFailedReserveCallGoOn(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		failing := &failReserves{}
		q := hookedQueue(t, be.client, failing)
		pushed(t, q, &Job{Topic: "t"})
		pushed(t, q, &Job{Topic: "t"})
		w, err := q.waiting()
		require.NoError(t, err)
		// Both signals, taken by a blocked call and held by the process.
		sig := q.keys.bucket(0).signals("t")
		require.NoError(t, be.client.LPopCount(ctx, sig, 2).Err())
		w.unused("t", 0, 2)

		failing.on.Store(true)
		_, err = q.pop(ctx, "t", 4, time.Minute)
		require.ErrorIs(t, err, errReserveRefused)
		failing.on.Store(false)
		require.Eventually(t, func() bool {
			return be.client.LLen(ctx, sig).Val() == 2
		}, 10*time.Second, time.Millisecond, "the signals go back")
		job, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err)
		require.NoError(t, q.Finish(ctx, job.ID))
	})
}

// refusedReply is failReserves' error: a reply, as a server's error is,
// so that the call is not sent again.
type refusedReply struct{}

func (refusedReply) Error() string { return "ERR reserve refused by the test" }
func (refusedReply) RedisError()   {}

var errReserveRefused error = refusedReply{}

// failReserves fails a client's reserve calls, unsent, while on.
type failReserves struct {
	on atomic.Bool
}

func (f *failReserves) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *failReserves) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if f.on.Load() && isReserveCall(cmd) {
			cmd.SetErr(errReserveRefused)
			return errReserveRefused
		}
		return next(ctx, cmd)
	}
}

func (f *failReserves) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if f.on.Load() && slices.ContainsFunc(cmds, isReserveCall) {
			for _, cmd := range cmds {
				cmd.SetErr(errReserveRefused)
			}
			return errReserveRefused
		}
		return next(ctx, cmds)
	}
}

// A blocked call takes as many signals as the waiting consumers want jobs,
// up to maxTake. Where each bucket has a call of its own (a Cluster), each
// takes up to its share of maxTake, so that a process's calls together
// take no more than maxTake; but one per consumer where more consumers
// wait.
func TestBlockedCallsTakeUpToAShareOfTheSignals(t *testing.T) {
	for _, groups := range []int{1, 8} {
		t.Run(fmt.Sprintf("%d blocked calls", groups), func(t *testing.T) {
			q := newQueue(t, miniredisClient(t), WithBuckets(8))
			w := idleWaits(t, q)
			for g := range groups {
				wg := &waitGroup{buckets: []int{g}, poke: q.keys.bucket(g).poke(w.token)}
				if groups == 1 {
					wg.buckets = []int{0, 1, 2, 3, 4, 5, 6, 7}
				}
				w.groups = append(w.groups, wg)
			}
			tw := w.topicLocked("t")
			tw.waiters = append(tw.waiters, &waiter{want: 16}, &waiter{want: 1})
			w.topicLocked("u").waiters = []*waiter{{want: 5}}
			total := 0
			for _, g := range w.groups {
				keys, n := w.wanted(g)
				assert.Len(t, keys, 2*8/groups+1, "the signal lists of its buckets, and its poke key")
				total += n
			}
			// A reply takes signals from one list: as many as one topic's
			// consumers want, not the topics' sum.
			if groups == 1 {
				assert.Equal(t, 17, total, "as many as the consumers want")
			} else {
				assert.Equal(t, maxTake, total, "a share of maxTake each")
			}

			// Many consumers waiting, each for a job: one signal each.
			tw.waiters, w.topicLocked("u").waiters = nil, nil
			w.topicLocked("v").waiters = make([]*waiter, 100)
			for i := range w.topicLocked("v").waiters {
				w.topicLocked("v").waiters[i] = &waiter{want: 1}
			}
			_, n := w.wanted(w.groups[0])
			assert.Equal(t, maxTake, n, "no call takes more than maxTake")
			w.topicLocked("v").waiters = w.topicLocked("v").waiters[:12]
			_, n = w.wanted(w.groups[0])
			assert.Equal(t, 12, n, "one per consumer")
		})
	}
}

// Jobs left without a signal are mostly jobs whose signals other processes
// took and are about to use. A waiting consumer looks for a lost signal
// only once this process's replies have said for strandedAfter that jobs
// were left without one, and not when one said since that the list ran
// dry.
func TestALookForALostSignalWaitsForTheListToStayBare(t *testing.T) {
	q := newQueue(t, miniredisClient(t), WithBuckets(1))
	w := idleWaits(t, q)
	wt := &waiter{wake: make(chan wakeUp, 1), want: 1}
	tw := w.topicLocked("t")
	tw.waiters = []*waiter{wt}
	woken := func() bool {
		select {
		case <-wt.wake:
			return true
		default:
			return false
		}
	}
	w.settle("t", 0, reserveNoSignal, reserveRanOut, 0) // jobs left without a signal
	w.lookStranded("t", 0)
	assert.False(t, woken(), "not before the list stayed bare that long")
	w.settle("t", 0, reserveDry, reserveRanOut, 0) // the list ran dry
	w.mu.Lock()
	assert.True(t, tw.bare[0].IsZero())
	w.mu.Unlock()
	w.lookStranded("t", 0)
	assert.False(t, woken(), "the list ran dry since")

	w.settle("t", 0, reserveNoSignal, reserveRanOut, 0)
	w.settle("t", 0, 0, reserveRanOut, 0) // took nothing: says nothing of the jobs
	w.mu.Lock()
	assert.False(t, tw.bare[0].IsZero(), "still bare")
	tw.bare[0] = tw.bare[0].Add(-strandedAfter)
	w.mu.Unlock()
	w.lookStranded("t", 0)
	assert.True(t, woken(), "a consumer looks once the list stayed bare that long")

	// No consumer waits when the time comes: the next to look looks there.
	w.mu.Lock()
	tw.waiters = nil
	tw.avail[0] = 0
	w.mu.Unlock()
	w.settle("t", 0, reserveNoSignal, reserveRanOut, 0)
	w.mu.Lock()
	tw.bare[0] = tw.bare[0].Add(-strandedAfter)
	w.mu.Unlock()
	w.lookStranded("t", 0)
	looks := w.plan("t", 1, 0, false)
	assert.Equal(t, []look{{b: 0, n: 1, lost: true, said: 5}}, looks, "the next consumer looks at the list for a lost signal, after 5 replies")
}

// A job left without a signal, ready for under a second, is not yet taken
// by a look (its signal may be on its way): every process whose reply said
// so looks again a second later, and goes on looking each second while it
// waits. One process a second looks at the list; the others' calls read
// only its length. Without this, each process's look cost a look at the
// list, and their cost grew with the processes.
func TestALostSignalIsLookedForByOneProcessASecondNotEach(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		const processes = 8
		p := startLostSignalPoppers(t, be, processes, time.Now().Add(time.Minute)) // fresh, however slow the machine
		require.Eventually(t, func() bool { return p.counter.lost.Load() >= processes }, 30*time.Second, time.Millisecond,
			"each process looks for the lost signal")
		p.stop()
		lost, looked := p.counter.lost.Load(), p.counter.lostLooked.Load()
		assert.GreaterOrEqual(t, looked, int64(1), "a process looks")
		assert.LessOrEqual(t, looked, lost/processes+1, "of %d looks for a lost signal, one a second looks at the list", lost)
	})
}

// lostSignalPoppers are processes that each Pop a job of topic "t", in
// one bucket whose one job lost its signal, ready since a given time.
type lostSignalPoppers struct {
	counter *reserveCounter // every process's reserve calls
	got     chan string     // the IDs popped
	stop    func()          // ends the pops and waits for them
}

// startLostSignalPoppers starts processes lostSignalPoppers; before the
// first starts, before may change what they find.
func startLostSignalPoppers(t *testing.T, be backend, processes int, readyAt time.Time, before ...func(*DelayQueue)) *lostSignalPoppers {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	name := uniqueName(t)
	producer := newQueue(t, be.client, WithName(name), WithBuckets(1))
	readySince(t, be, producer, readyAt, jobsWithoutSignals(t, be, producer, 1)...)
	for _, f := range before {
		f(producer)
	}
	p := &lostSignalPoppers{counter: &reserveCounter{}, got: make(chan string, processes)}
	var wg sync.WaitGroup
	for range processes {
		c := anotherClient(t, be.client)
		c.AddHook(p.counter)
		q := newQueue(t, c, WithName(name), WithBuckets(1))
		wg.Add(1)
		go func() {
			defer wg.Done()
			job, err := q.Pop(ctx, "t", time.Minute)
			if err == nil {
				p.got <- job.ID
				return
			}
			assert.ErrorIs(t, err, context.Canceled)
		}()
	}
	p.stop = func() {
		cancel()
		wg.Wait()
		close(p.got)
	}
	t.Cleanup(cancel)
	return p
}

// Processes that start together look at a bucket as looks for a lost
// signal do: one a second looks at the list. Here another process looked
// a moment ago, so none of them does, though a job waits there with no
// signal (a worker that held it was stopped with every other).
func TestTheFirstLooksOfProcessesThatStartTogetherLookOnceASecond(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		const processes = 8
		p := startLostSignalPoppers(t, be, processes, time.Now().Add(-time.Minute), func(q *DelayQueue) {
			lost := q.keys.bucket(0).lost("t")
			require.NoError(t, be.client.Set(context.Background(), lost, time.Now().Add(time.Minute).UnixMilli(), time.Minute).Err())
		})
		require.Eventually(t, func() bool { return p.counter.lost.Load() >= processes }, 30*time.Second, time.Millisecond,
			"each process's first look is one for a lost signal")
		p.stop()
		assert.Zero(t, p.counter.lostLooked.Load(), "another process looked in the last second: none looks at the list")
		assert.Empty(t, p.got)
	})
}

// A job whose signal was lost is taken once, by one of several processes
// that wait, long before their blocked calls' waits end: whichever of
// them sets the bucket's key looks, and the others read the list's
// length.
func TestAJobWhoseSignalWasLostIsTakenOnceAmongProcesses(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx, cancel := context.WithTimeout(context.Background(), blockFor/2)
		defer cancel()
		const processes = 4
		name := uniqueName(t)
		producer := newQueue(t, be.client, WithName(name), WithBuckets(1))
		first := pushed(t, producer, &Job{Topic: "t"})
		lost := pushed(t, producer, &Job{Topic: "t"})
		// The second job's signal goes with a process that dies.
		require.NoError(t, be.client.LPop(ctx, producer.keys.bucket(0).signals("t")).Err())
		got := make(chan string, 2*processes)
		var wg sync.WaitGroup
		for range processes {
			q := newQueue(t, anotherClient(t, be.client), WithName(name), WithBuckets(1))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					job, err := q.Pop(ctx, "t", time.Minute)
					if err != nil {
						return
					}
					got <- job.ID
					assert.NoError(t, q.Finish(context.Background(), job.ID))
				}
			}()
		}
		var ids []string
		for len(ids) < 2 {
			select {
			case id := <-got:
				ids = append(ids, id)
			case <-ctx.Done():
				t.Fatalf("the job without a signal was not taken before the blocked calls' waits end; got %v", ids)
			}
		}
		assert.ElementsMatch(t, []string{first, lost}, ids)
		cancel()
		wg.Wait()
		close(got)
		for id := range got {
			t.Errorf("job %s delivered again", id)
		}
	})
}

// A look for a lost signal that holds none and finds none looks at the
// list only when no other call did in the last second, and otherwise
// reads its length and says that jobs are left without a signal, as a
// claim that finds the signals taken does. Finding signals left, it takes
// as a look does, whoever looked.
func TestALookForALostSignalLooksOnlyWhereNoneDidInTheLastSecond(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		lost := q.keys.bucket(0).lost("t")
		ids := jobsWithoutSignals(t, be, q, 2)
		readySince(t, be, q, time.Now().Add(-time.Minute), ids...)
		// Another process looked; its look stands for a minute.
		require.NoError(t, be.client.Set(ctx, lost, time.Now().Add(time.Minute).UnixMilli(), time.Minute).Err())

		c, err := q.reserve(ctx, 0, "t", 1, 0, reserveLost)
		require.NoError(t, err)
		assert.Empty(t, c.jobs, "another process looked")
		assert.Equal(t, reserveUnclaimed, c.status)
		assert.Equal(t, reserveNoSignal, c.left)

		// Its time is over, though the key is still there (a server
		// whose keys do not expire as time passes, as miniredis).
		require.NoError(t, be.client.Set(ctx, lost, time.Now().Add(-time.Millisecond).UnixMilli(), time.Minute).Err())
		c, err = q.reserve(ctx, 0, "t", 1, 0, reserveLost)
		require.NoError(t, err)
		require.Len(t, c.jobs, 1, "the look takes the job that waited a second with no signal")
		assert.Equal(t, ids[0], c.jobs[0].ID)
		assert.Equal(t, 1, c.left, "and signals the one behind it")
		ttl, err := be.client.PTTL(ctx, lost).Result()
		require.NoError(t, err)
		assert.True(t, ttl > 0 && ttl <= time.Second, "the look holds off the others for a second, not %v", ttl)

		c, err = q.reserve(ctx, 0, "t", 1, 0, reserveLost)
		require.NoError(t, err)
		require.Len(t, c.jobs, 1, "a signal is left: the call takes it, as a look does")
		assert.Equal(t, ids[1], c.jobs[0].ID)
	})
}

// A reserve call that leaves signals takes as many of them as this
// process's waiting consumers want and gives them to those consumers,
// whose reserve calls then hold them: left in the list, they would be
// claimed, and other processes' blocked calls often take them first.
func TestAReserveCallGivesTheSignalsItLeavesToTheConsumersThatWait(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		sig := q.keys.bucket(0).signals("t")
		w := idleWaits(t, q)
		q.mu.Lock()
		q.waits = w
		q.mu.Unlock()
		waiting := &waiter{wake: make(chan wakeUp, 1), want: 2}
		w.mu.Lock()
		w.topicLocked("t").waiters = []*waiter{waiting}
		w.mu.Unlock()
		for range 4 {
			pushed(t, q, &Job{Topic: "t"})
		}

		c, err := q.reserve(ctx, 0, "t", 1, 0, reserveSignalled)
		require.NoError(t, err)
		require.Len(t, c.jobs, 1)
		select {
		case u := <-waiting.wake:
			assert.Equal(t, wakeUp{b: 0, n: 2}, u, "two signals for the consumer that wants two jobs")
		default:
			t.Fatal("the waiting consumer was given no signal")
		}
		assert.Equal(t, 1, c.left, "the signal no consumer of this process wants is left")
		n, err := be.client.LLen(ctx, sig).Result()
		require.NoError(t, err)
		assert.Equal(t, int64(1), n)

		c, err = q.reserve(ctx, 0, "t", 2, 2, reserveSignalled) // the consumer given the signals
		require.NoError(t, err)
		assert.Len(t, c.jobs, 2)
		c, err = q.reserve(ctx, 0, "t", 1, 0, reserveSignalled) // none waits: nothing given
		require.NoError(t, err)
		assert.Len(t, c.jobs, 1)
		assert.Equal(t, reserveDry, c.left)
	})
}

// The signals a call gives are its caller's: the jobs behind the ones it
// took have theirs, however long they waited, and the reply says none is
// missing. A call sent again after its reply was lost gives the signals
// its first run took, which are off the list.
func TestTheSignalsACallGivesAreTheJobsBehindIt(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		sig := q.keys.bucket(0).signals("t")
		var ids []string
		for range 4 {
			ids = append(ids, pushed(t, q, &Job{Topic: "t"}))
		}
		readySince(t, be, q, time.Now().Add(-time.Minute), ids...)

		call := q.reserveCall(0, "t", 1, 0, reserveSignalled, nil, 3)
		for run := range 2 { // the second: its first's reply was lost
			q.sendCalls(ctx, []*scriptCall{call})
			jobs, _, left, err := q.reserved(ctx, 0, "t", call)
			require.NoError(t, err)
			require.Len(t, jobs, 1, "run %d", run)
			assert.Equal(t, 3, reserveGiven(call.cmd), "run %d gives the three signals", run)
			assert.Equal(t, 0, left, "run %d: no signal left, and none missing", run)
			n, err := be.client.LLen(ctx, sig).Result()
			require.NoError(t, err)
			assert.Zero(t, n, "run %d: no signal added for the jobs behind", run)
		}
		q.answered([]*scriptCall{call})
	})
}

// The signals calls under way take for a process's waiting consumers are
// counted until they are given: calls to two buckets at once do not both
// take signals for the same consumers.
func TestCallsUnderWayDoNotTakeSignalsTwiceForOneConsumer(t *testing.T) {
	q := newQueue(t, miniredisClient(t), WithBuckets(2))
	w := idleWaits(t, q)
	waiting := &waiter{wake: make(chan wakeUp, 1), want: 2}
	w.mu.Lock()
	w.topicLocked("t").waiters = []*waiter{waiting}
	w.mu.Unlock()
	assert.Equal(t, 2, w.toGive("t"))
	assert.Zero(t, w.toGive("t"), "the first call takes them")
	w.gave("t", 0, 2, 0) // it found none to give
	assert.Equal(t, 2, w.toGive("t"))
	w.gave("t", 1, 2, 2)
	assert.Equal(t, wakeUp{b: 1, n: 2}, <-waiting.wake)
	assert.Zero(t, w.toGive("t"), "no consumer waits")
}

// Looks of one process's consumers that start together, sent before the
// first reply, find the key that the process's own first look set: the
// process is not put off as if another process looked.
func TestAProcessIsNotPutOffByItsOwnLook(t *testing.T) {
	w := idleWaits(t, newQueue(t, miniredisClient(t), WithBuckets(1)))
	w.lostLooked("t", 0, false) // the first look looked
	w.lostLooked("t", 0, true)  // one sent with it found its key
	w.mu.Lock()
	assert.True(t, w.topicLocked("t").quiet[0].IsZero(), "not put off by its own look")
	w.topicLocked("t").looked[0] = time.Now().Add(-strandedAfter)
	w.mu.Unlock()
	w.lostLooked("t", 0, true) // a look a while later: another process's key
	w.mu.Lock()
	defer w.mu.Unlock()
	assert.True(t, w.topicLocked("t").quiet[0].After(time.Now()), "put off: another process looks")
}

// A process whose look for a lost signal found that another process had
// looked leaves the looks there to others for a while: its next comes
// othersLook later, not strandedAfter.
func TestAProcessThatFoundAnotherLookingLooksLessOften(t *testing.T) {
	q := newQueue(t, miniredisClient(t), WithBuckets(1))
	w := idleWaits(t, q)
	wt := &waiter{wake: make(chan wakeUp, 1), want: 1}
	tw := w.topicLocked("t")
	tw.waiters = []*waiter{wt}
	w.settle("t", 0, reserveNoSignal, reserveUnclaimed, 0)
	w.lostLooked("t", 0, true)
	w.mu.Lock()
	tw.bare[0] = tw.bare[0].Add(-strandedAfter)
	w.mu.Unlock()
	w.lookStranded("t", 0)
	select {
	case <-wt.wake:
		t.Fatal("a look while another process looks")
	default:
	}
	w.mu.Lock()
	assert.True(t, tw.recheck[0], "the look is put off, not dropped")
	tw.quiet[0] = time.Now().Add(-time.Millisecond)
	w.mu.Unlock()
	w.lookStranded("t", 0)
	select {
	case u := <-wt.wake:
		assert.Equal(t, noSignal, u.b)
	default:
		t.Fatal("no look once the others' while is over")
	}
	assert.Equal(t, []look{{b: 0, n: 1, lost: true, said: 1}}, w.plan("t", 1, 0, false))
}

// Requests that go to one list together make one call, which looks at
// the list if one of them would.
func TestACallForSeveralRequestsLooksIfOneWould(t *testing.T) {
	for _, c := range []struct{ m, o, want reserveMode }{
		{reserveClaim, reserveClaim, reserveClaim},
		{reserveClaim, reserveLost, reserveLost},
		{reserveLost, reserveClaim, reserveLost},
		{reserveLost, reserveSignalled, reserveSignalled},
		{reserveSignalled, reserveClaim, reserveSignalled},
		{reserveGreedy, reserveGreedy, reserveGreedy},
	} {
		assert.Equal(t, c.want, c.m.with(c.o), "%v with %v", c.m, c.o)
	}
}

// Consumers that plan together go first where the most signals are left,
// whatever bucket each would start from, so that their reserve calls
// share one script call; once those signals are spoken for, they go on to
// the next most.
func TestConsumersGoWhereTheMostSignalsAreLeft(t *testing.T) {
	q := newQueue(t, miniredisClient(t), WithBuckets(4))
	w, err := q.waiting()
	require.NoError(t, err)
	w.mu.Lock()
	tw := w.topicLocked("t")
	copy(tw.avail, []int{1, 0, 3, unknown})
	w.mu.Unlock()

	// Where signals are left, a consumer comes to claim them; where not
	// known, to look.
	assert.Equal(t, []look{{b: 2, n: 1, claim: true}}, w.plan("t", 1, 0, false))
	assert.Equal(t, []look{{b: 2, n: 1, claim: true}}, w.plan("t", 1, 1, false), "from another start too")
	assert.Equal(t, []look{{b: 0, n: 1, claim: true}, {b: 2, n: 1, claim: true}, {b: 3, n: 2, lost: true}}, w.plan("t", 4, 3, false),
		"the rest, as many each, from the start on; then where not known (a first look: for a lost signal too)")
}

// A reserve call says whether jobs are left without a signal, and says the
// list ran dry only when it read the list to its end: a call that took
// nothing because no signal was left, while a job heads the list, says that
// jobs are left, so that a look for a lost signal comes.
func TestAReserveCallSaysWhetherJobsAreLeftWithoutASignal(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		start := time.Now()
		pushed(t, q, &Job{Topic: "t"})
		pushed(t, q, &Job{Topic: "t"})
		pushed(t, q, &Job{Topic: "t"})
		// Another process takes two of the signals, and holds them.
		sig := q.keys.bucket(0).signals("t")
		require.NoError(t, be.client.LPopCount(ctx, sig, 2).Err())

		c, err := q.reserve(ctx, 0, "t", 2, 0, reserveSignalled)
		require.NoError(t, err)
		assert.Len(t, c.jobs, 1, "the one signal left")
		assert.Equal(t, reserveNoSignal, c.left, "jobs are left, their signals held elsewhere")

		c, err = q.reserve(ctx, 0, "t", 2, 0, reserveSignalled)
		require.NoError(t, err)
		if time.Since(start) >= time.Second {
			// The head job waited over a second: a call takes it
			// regardless (a lost signal), and this test says nothing.
			t.Skip("the machine stalled for over a second")
		}
		assert.Empty(t, c.jobs)
		assert.Equal(t, reserveNoSignal, c.left, "no signal, and a job heads the list")

		c, err = q.reserve(ctx, 0, "t", 2, 2, reserveSignalled) // the holder comes
		require.NoError(t, err)
		assert.Len(t, c.jobs, 2)
		assert.Equal(t, reserveDry, c.left, "the call read the list to its end")

		c, err = q.reserve(ctx, 0, "t", 2, 0, reserveSignalled)
		require.NoError(t, err)
		assert.Empty(t, c.jobs)
		assert.Equal(t, reserveDry, c.left, "it looked at the list: it holds no job")
	})
}

// A reserve call that takes a job whose signal was lost (it waited over a
// second with none left) adds a signal for the job behind it, when that
// one waited as long too, so that a waiting consumer comes for it. So does
// one that takes a job long after it was ready, whatever the job behind:
// the job taken was taken on that one's signal. It adds none when it took
// a fresh job, and a fresh job is behind, whose signal is on its way.
func TestAReserveCallSignalsAStrandedJobBehindTheOnesItTook(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		bk := q.keys.bucket(0)
		// Every signal was lost with a process that died, and the first two
		// jobs have waited for a minute since.
		ids := jobsWithoutSignals(t, be, q, 4)
		readySince(t, be, q, time.Now().Add(-time.Minute), ids[:2]...)
		readySince(t, be, q, time.Now().Add(time.Minute), ids[2:]...) // fresh, however slow the machine

		c, err := q.reserve(ctx, 0, "t", 1, 0, reserveSignalled)
		require.NoError(t, err)
		require.Len(t, c.jobs, 1)
		assert.Equal(t, ids[0], c.jobs[0].ID)
		assert.Equal(t, 1, c.left, "a signal for the stranded job behind it")
		n, err := be.client.LLen(ctx, bk.signals("t")).Result()
		require.NoError(t, err)
		assert.EqualValues(t, 1, n)

		// A consumer takes that signal, as a blocked call does, and comes.
		take := func(want string) *reserveCall {
			t.Helper()
			require.NoError(t, be.client.LPop(ctx, bk.signals("t")).Err())
			c, err := q.reserve(ctx, 0, "t", 1, 1, reserveSignalled)
			require.NoError(t, err)
			require.Len(t, c.jobs, 1)
			assert.Equal(t, want, c.jobs[0].ID)
			return c
		}
		c = take(ids[1])
		assert.Equal(t, 1, c.left, "the job taken had waited: the fresh job behind is owed a signal")
		c = take(ids[2])
		assert.Equal(t, reserveNoSignal, c.left, "a fresh job taken, a fresh job behind: its signal is on its way")
	})
}

// A call that comes only to claim signals a reply said were left, and
// finds them taken, reads nothing more of the list than its length: it
// takes not even a job that waited over a second without a signal, which
// a look takes, and says that jobs are left without a signal, so that a
// look for a lost signal comes; or that the list is dry. With signals
// left, it takes as a look does; and sent again after a lost reply that
// found the signals it took gone, it answers from its record.
func TestAClaimThatFindsTheSignalsTakenReadsNothingMore(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		sig := q.keys.bucket(0).signals("t")
		// Other processes took every signal, and the jobs have waited
		// for a minute since.
		ids := jobsWithoutSignals(t, be, q, 3)
		readySince(t, be, q, time.Now().Add(-time.Minute), ids...)

		c, err := q.reserve(ctx, 0, "t", 2, 0, reserveClaim)
		require.NoError(t, err)
		assert.Empty(t, c.jobs)
		assert.Equal(t, reserveUnclaimed, c.status)
		assert.Equal(t, reserveNoSignal, c.left, "jobs are left without a signal")
		counts, err := q.Counts(ctx, "t")
		require.NoError(t, err)
		assert.Equal(t, 3, counts.Ready, "nothing taken")
		c, err = q.reserve(ctx, 0, "t", 1, 0, reserveSignalled)
		require.NoError(t, err)
		require.Len(t, c.jobs, 1, "a look takes the stranded job")
		assert.Equal(t, ids[0], c.jobs[0].ID)

		// Two signals are left: a claim takes them, as a look does.
		require.NoError(t, be.client.Del(ctx, sig).Err())
		require.NoError(t, be.client.RPush(ctx, sig, "1", "1").Err())
		call := q.reserveCall(0, "t", 2, 0, reserveClaim, nil, 0)
		var got [2][]*Job
		var left [2]int
		for i := range 2 { // the second run: its first's reply was lost
			q.sendCalls(ctx, []*scriptCall{call})
			got[i], _, left[i], err = q.reserved(ctx, 0, "t", call)
			require.NoError(t, err)
		}
		q.answered([]*scriptCall{call})
		require.Len(t, got[0], 2)
		assert.Equal(t, []string{ids[1], ids[2]}, []string{got[0][0].ID, got[0][1].ID})
		assert.Equal(t, reserveDry, left[0])
		require.Len(t, got[1], 2, "the second run, which finds no signal, answers from the record")
		assert.Equal(t, got[0][0].ID, got[1][0].ID)
		assert.Equal(t, got[0][1].ID, got[1][1].ID)
		counts, err = q.Counts(ctx, "t")
		require.NoError(t, err)
		assert.Equal(t, 0, counts.Ready)
		assert.Equal(t, 3, counts.Reserved)

		c, err = q.reserve(ctx, 0, "t", 2, 0, reserveClaim)
		require.NoError(t, err)
		assert.Equal(t, reserveUnclaimed, c.status)
		assert.Equal(t, reserveDry, c.left, "the list holds nothing")
	})
}

// A reserve call sent again after a lost reply answers from its record
// when the topic was paused in between: the jobs its first run reserved
// go to the caller, not back after their TTR.
func TestAReserveSentAgainAfterAPauseAnswersFromItsRecord(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		id := pushed(t, q, &Job{Topic: "t"})
		call := q.reserveCall(0, "t", 1, 0, reserveGreedy, nil, 0)
		q.sendCalls(ctx, []*scriptCall{call})
		first, _, _, err := q.reserved(ctx, 0, "t", call)
		require.NoError(t, err)
		require.Len(t, first, 1)
		require.NoError(t, q.Pause(ctx, "t"))

		q.sendCalls(ctx, []*scriptCall{call}) // its first reply was lost
		again, _, _, err := q.reserved(ctx, 0, "t", call)
		require.NoError(t, err)
		q.answered([]*scriptCall{call})
		require.Len(t, again, 1, "the second run answers from the record")
		assert.Equal(t, id, again[0].ID)
		assert.Equal(t, first[0].reservation, again[0].reservation)
	})
}

// jobsWithoutSignals pushes n ready jobs of topic "t" to q, of one bucket,
// and deletes their signals, and returns their IDs in the list's order.
func jobsWithoutSignals(t *testing.T, be backend, q *DelayQueue, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = pushed(t, q, &Job{Topic: "t"})
	}
	require.NoError(t, be.client.Del(context.Background(), q.keys.bucket(0).signals("t")).Err())
	return ids
}

// readySince rewrites the ready jobs ids of bucket 0 as ready since at.
func readySince(t *testing.T, be backend, q *DelayQueue, at time.Time, ids ...string) {
	t.Helper()
	ctx := context.Background()
	pool := q.keys.bucket(0).pool
	for _, id := range ids {
		v, err := be.client.HGet(ctx, pool, id).Bytes()
		require.NoError(t, err)
		ms := at.UnixMilli()
		for i := range 6 { // the 6-byte at_ms, from the 10th byte (codec.go)
			v[9+i] = byte(ms >> (8 * (5 - i)))
		}
		require.NoError(t, be.client.HSet(ctx, pool, id, v).Err())
	}
}

// A job whose signal was lost is found by the look for it even behind
// stale entries (the traces of removed jobs) at the head of its list,
// which only a call with signals would otherwise drop: with no signal for
// the topic ever again, the job would wait for a blocked call's whole
// wait. A call that finds only stale entries as far as it may look says
// that jobs may be left, so that the look comes again.
func TestALookForALostSignalSeesPastStaleEntries(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		bk := q.keys.bucket(0)
		var removed []string
		for range staleSkips + 3 {
			removed = append(removed, pushed(t, q, &Job{Topic: "t"}))
		}
		job := pushed(t, q, &Job{Topic: "t"})
		readySince(t, be, q, time.Now().Add(time.Minute), job) // fresh, however slow the machine
		for _, id := range removed {
			require.NoError(t, q.Remove(ctx, id))
		}
		require.NoError(t, be.client.Del(ctx, bk.signals("t")).Err())

		c, err := q.reserve(ctx, 0, "t", 1, 0, reserveSignalled)
		require.NoError(t, err)
		assert.Empty(t, c.jobs)
		assert.Equal(t, reserveStale, c.status)
		assert.Equal(t, reserveNoSignal, c.left, "only stale entries as far as it looked: jobs may be left")
		n, err := be.client.LLen(ctx, bk.ready("t")).Result()
		require.NoError(t, err)
		assert.EqualValues(t, 4, n, "it dropped staleSkips entries")

		c, err = q.reserve(ctx, 0, "t", 1, 0, reserveSignalled)
		require.NoError(t, err)
		assert.Empty(t, c.jobs, "the job is fresh: its signal may be on its way")
		assert.Equal(t, reserveNoSignal, c.left, "a job is left without a signal")
		n, err = be.client.LLen(ctx, bk.ready("t")).Result()
		require.NoError(t, err)
		assert.EqualValues(t, 1, n, "the stale entries before it are dropped")

		readySince(t, be, q, time.Now().Add(-time.Minute), job)
		c, err = q.reserve(ctx, 0, "t", 1, 0, reserveSignalled)
		require.NoError(t, err)
		require.Len(t, c.jobs, 1, "its signal was lost: it is taken")
		assert.Equal(t, job, c.jobs[0].ID)
		assert.Equal(t, reserveDry, c.left)
	})
}

// Pops woken together by the signals of one bucket reserve their jobs in
// one script call. Without it the first woken sends its call alone, and
// the rest send a second once its reply is back.
func TestPopsWokenTogetherReserveInOneCall(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		counter := &reserveCounter{}
		q := hookedQueue(t, be.client, counter)
		w, err := q.waiting()
		require.NoError(t, err)
		w.woken = time.Minute // however slowly the woken come, they all do
		const pops = 4
		var want []string
		for range pops {
			want = append(want, pushed(t, q, &Job{Topic: "t"}))
		}
		// The signals, taken by a blocked call that is about to hand
		// them over.
		require.NoError(t, be.client.LPopCount(ctx, q.keys.bucket(0).signals("t"), pops).Err())

		got := make(chan string, pops)
		for range pops {
			go func() {
				job, err := q.Pop(ctx, "t", time.Minute)
				if assert.NoError(t, err) {
					got <- job.ID
				}
			}()
		}
		require.Eventually(t, func() bool { return waitersOf(q, "t") == pops },
			10*time.Second, time.Millisecond, "the Pops wait")
		before := counter.calls.Load()
		w.unused("t", 0, pops)
		var ids []string
		for range pops {
			ids = append(ids, <-got)
		}
		assert.ElementsMatch(t, want, ids)
		assert.EqualValues(t, 1, counter.calls.Load()-before, "one reserve call for the Pops woken together")
	})
}

// A look for a lost signal at a list of stale entries only drops them
// and says the list ran dry: its place count starts over.
func TestALookAtAListOfStaleEntriesSaysItRanDry(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		bk := q.keys.bucket(0)
		for range 3 {
			require.NoError(t, q.Remove(ctx, pushed(t, q, &Job{Topic: "t"})))
		}
		require.NoError(t, be.client.Del(ctx, bk.signals("t")).Err())

		c, err := q.reserve(ctx, 0, "t", 1, 0, reserveSignalled)
		require.NoError(t, err)
		assert.Empty(t, c.jobs)
		assert.Equal(t, reserveDry, c.left)
		n, err := be.client.LLen(ctx, bk.ready("t")).Result()
		require.NoError(t, err)
		assert.Zero(t, n)
		head, err := be.client.HGet(ctx, bk.counts, "0:t").Result()
		if err != redis.Nil {
			require.NoError(t, err)
			assert.Equal(t, "0", head, "the place count starts over")
		}
	})
}

// A call that holds a signal and stops at the stale-entry limit with
// nothing found, no signal left, says jobs may be left without one, so
// that the look for a lost signal comes.
func TestACallStoppedByStaleEntriesSaysJobsMayBeLeft(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		bk := q.keys.bucket(0)
		for range staleSkips + 1 {
			require.NoError(t, q.Remove(ctx, pushed(t, q, &Job{Topic: "t"})))
		}
		job := pushed(t, q, &Job{Topic: "t"})
		require.NoError(t, be.client.Del(ctx, bk.signals("t")).Err())

		c, err := q.reserve(ctx, 0, "t", 1, 1, reserveSignalled) // its signal, taken by a blocked call
		require.NoError(t, err)
		assert.Empty(t, c.jobs)
		assert.Equal(t, reserveStale, c.status)
		assert.Equal(t, reserveNoSignal, c.left)

		c, err = q.reserve(ctx, 0, "t", 1, 1, reserveSignalled)
		require.NoError(t, err)
		require.Len(t, c.jobs, 1)
		assert.Equal(t, job, c.jobs[0].ID)
	})
}

// A process that waits for many topics holds a blocked call per bucket
// group, not one per topic: a handful of connections.
func TestWaitingForManyTopicsTakesAHandfulOfConnections(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		if be.mini != nil {
			t.Skip("miniredis has no CLIENT LIST")
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		q := newQueue(t, be.client)
		const topics = 500
		var wg sync.WaitGroup
		got := make(chan string, 1)
		for i := range topics {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if job, err := q.Pop(ctx, fmt.Sprintf("t%d", i), time.Minute); err == nil {
					got <- job.ID
				}
			}()
		}
		require.Eventually(t, func() bool {
			for i := range topics {
				if !blockedFor(q, fmt.Sprintf("t%d", i)) {
					return false
				}
			}
			return true
		}, 30*time.Second, time.Millisecond, "every topic waited for")
		blocked := 0
		count := func(ctx context.Context, c *redis.Client) error {
			list, err := c.ClientList(ctx).Result()
			for _, line := range strings.Split(list, "\n") {
				if strings.Contains(line, " flags=b ") { // blocked now
					blocked++
				}
			}
			return err
		}
		if cc, ok := be.client.(*redis.ClusterClient); ok {
			var mu sync.Mutex
			require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
				mu.Lock()
				defer mu.Unlock()
				return count(ctx, c)
			}))
		} else {
			require.NoError(t, count(ctx, be.client.(*redis.Client)))
		}
		assert.LessOrEqual(t, blocked, q.opts.buckets, "one blocked call per bucket at most, whatever the topics")
		id := pushed(t, q, &Job{Topic: "t250"})
		assert.Equal(t, id, <-got, "its consumer took it")
		cancel()
		wg.Wait()
	})
}

// anotherClient returns a new client of the Redis that c talks to, closed
// when the test ends.
// Blocked calls hold a connection for up to blockFor each, on a pool of
// their own: started instances sharing a client whose pool has fewer
// connections than they have blocked calls still push, pop, finish and
// close. On the client's own pool the blocked calls would take every
// connection, and every other call would wait out the pool's timeout.
func TestBlockedCallsLeaveTheClientsPoolToTheScripts(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		small := smallPoolClient(t, be.client, 2)
		name := uniqueName(t)
		qs := make([]*DelayQueue, 4)
		for i := range qs {
			qs[i] = newQueue(t, small, WithName(name))
			startQueue(t, qs[i])
		}
		type popped struct {
			q   *DelayQueue
			job *Job
		}
		got := make(chan popped, len(qs))
		for _, q := range qs {
			go func() {
				if job, err := q.Pop(ctx, "t", time.Minute); err == nil {
					got <- popped{q, job}
				}
			}()
		}
		require.Eventually(t, allBlockedFor(qs, "t"), 30*time.Second, time.Millisecond, "every instance waits")
		for range qs {
			pushed(t, qs[0], &Job{Topic: "t"})
		}
		for range qs {
			select {
			case p := <-got:
				require.NoError(t, p.q.Finish(ctx, p.job.ID))
			case <-time.After(30 * time.Second):
				t.Fatal("a pushed job was never popped")
			}
		}
		for _, q := range qs {
			require.NoError(t, q.Close(ctx))
		}
	})
}

// smallPoolClient is a client to c's server or Cluster with size
// connections (per node), which waits a short while for one.
func smallPoolClient(t *testing.T, c redis.UniversalClient, size int) redis.UniversalClient {
	var small redis.UniversalClient
	switch c := c.(type) {
	case *redis.ClusterClient:
		small = redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Options().Addrs, PoolSize: size, PoolTimeout: time.Second})
	case *redis.Client:
		small = redis.NewClient(&redis.Options{Addr: c.Options().Addr, PoolSize: size, PoolTimeout: time.Second})
	default:
		t.Fatalf("a client of type %T", c)
	}
	t.Cleanup(func() { _ = small.Close() })
	return small
}

// hookedQueue is a queue of one bucket on a client of its own, which hook
// watches.
func hookedQueue(t *testing.T, c redis.UniversalClient, hooks ...redis.Hook) *DelayQueue {
	other := anotherClient(t, c)
	for _, h := range hooks {
		other.AddHook(h)
	}
	return newQueue(t, other, WithBuckets(1))
}

func anotherClient(t *testing.T, c redis.UniversalClient) redis.UniversalClient {
	var other redis.UniversalClient
	switch c := c.(type) {
	case *redis.ClusterClient:
		other = redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Options().Addrs})
	case *redis.Client:
		other = redis.NewClient(&redis.Options{Addr: c.Options().Addr})
	default:
		t.Fatalf("a client of type %T", c)
	}
	t.Cleanup(func() { _ = other.Close() })
	return other
}

// A signal taken by a process that died before it reserved the job is lost:
// the job waits in its list with none. A consumer of a process whose
// reserve call left jobs without a signal looks again a second later and
// takes it, long before its blocked call's wait ends (blockFor).
func TestAJobWhoseSignalWasLostIsTakenByAWaitingConsumer(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		first := pushed(t, q, &Job{Topic: "t"})
		second := pushed(t, q, &Job{Topic: "t"})
		// The second job's signal goes with a process that dies.
		require.NoError(t, be.client.LPop(ctx, q.keys.bucket(0).signals("t")).Err())

		job, err := q.Pop(ctx, "t", time.Minute)
		require.NoError(t, err)
		assert.Equal(t, first, job.ID)
		job, err = q.Pop(ctx, "t", blockFor/2)
		require.NoError(t, err, "the job without a signal is taken before the blocked call's wait ends")
		assert.Equal(t, second, job.ID)
	})
}

// A signal a process took while none of its consumers waited (the one it
// was taken for left) is held for the next consumer; a consumer that then
// starts to wait gets it at once. Its blocked calls would neither take it
// from Redis before it is given back nor hear when it is: without this,
// the consumer waited for another job's signal, or for the blocked call's
// whole wait.
func TestASignalHeldGoesToTheNextConsumerThatWaits(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		pushed(t, q, &Job{Topic: "t"})
		w, err := q.waiting()
		require.NoError(t, err)
		// The job's signal, taken by a blocked call for a consumer that
		// has gone.
		require.NoError(t, be.client.LPop(ctx, q.keys.bucket(0).signals("t")).Err())
		w.unused("t", 0, 1)

		wt := &waiter{wake: make(chan wakeUp, 1), want: 1}
		w.enlist("t", wt)
		defer w.leave("t", wt)
		select {
		case u := <-wt.wake:
			assert.Equal(t, wakeUp{b: 0, n: 1}, u, "the held signal, of bucket 0")
		case <-time.After(blockFor / 2):
			t.Fatal("a consumer that starts to wait is not given the signal held")
		}
	})
}

// TestAHolderSignalsAJobWhoseSignalAFrozenProcessTook: a process that stops
// reading its replies (frozen, or cut off while its connection stays open)
// may be handed the signal of a job that came back from an expired
// reservation, and consumers blocked in other processes do not wake for
// it. A second after it made the job ready, the bucket's holder gives it a
// signal again, and a waiting consumer takes it long before its blocked
// call would have looked by itself (blockFor).
func TestAHolderSignalsAJobWhoseSignalAFrozenProcessTook(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		if be.mini != nil {
			t.Skip("miniredis lists no blocked clients")
		}
		ctx := context.Background()
		name := uniqueName(t)
		holder := newQueue(t, be.client, WithName(name))
		startQueue(t, holder)
		id := pushed(t, holder, &Job{Topic: "t", TTR: 5 * time.Second})
		job, err := holder.Pop(ctx, "t", 0)
		require.NoError(t, err)
		require.Equal(t, id, job.ID) // never finished: back at its TTR
		b, err := bucketOfID(id, holder.opts.buckets)
		require.NoError(t, err)
		// The frozen process: blocked first, it is handed the signal and
		// never reserves the job.
		node, swallowed := frozenOn(t, be, holder.keys.bucket(b).signals("t"))
		// A consumer of another process, blocked after it, before the job
		// comes back.
		other := newQueue(t, be.client, WithName(name))
		got := make(chan string, 1)
		go func() {
			job, err := other.Pop(ctx, "t", 15*time.Second)
			if err != nil {
				got <- err.Error()
				return
			}
			got <- job.ID
		}()
		require.Eventually(t, func() bool { return blockedFor(other, "t") && blockedOn(t, node, "") >= 2 }, 10*time.Second, time.Millisecond)
		back, err := holder.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, StateReserved, back.State, "all in place before the job came back")

		require.NoError(t, <-swallowed, "the job came back, and its signal went to the frozen process")
		assert.Equal(t, id, <-got, "the waiting consumer took the job all the same")
	})
}

// frozenOn blocks a client of its own on the signal list signals, as a
// process that then froze: Redis hands it the next signals, which nobody
// uses. It returns the list's node and the blocked call's end.
func frozenOn(t *testing.T, be backend, signals string) (*redis.Client, <-chan error) {
	t.Helper()
	ctx := context.Background()
	node, _ := be.client.(*redis.Client)
	if cc, ok := be.client.(*redis.ClusterClient); ok {
		var err error
		node, err = cc.MasterForKey(ctx, signals)
		require.NoError(t, err)
	}
	frozen := redis.NewClient(&redis.Options{Addr: node.Options().Addr, ClientName: "frozen"})
	t.Cleanup(func() { _ = frozen.Close() })
	swallowed := make(chan error, 1)
	go func() { swallowed <- frozen.BLMPop(ctx, 0, "left", 100, signals).Err() }()
	require.Eventually(t, func() bool { return blockedOn(t, node, "frozen") == 1 }, 10*time.Second, time.Millisecond)
	return node, swallowed
}

// blockedOn counts the clients of node blocked in a call, of those named
// name ("": all).
func blockedOn(t *testing.T, node *redis.Client, name string) int {
	t.Helper()
	list, err := node.ClientList(context.Background()).Result()
	require.NoError(t, err)
	n := 0
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, " flags=b ") && (name == "" || strings.Contains(line, " name="+name+" ")) {
			n++
		}
	}
	return n
}

// TestAHolderSignalsAPushedJobWhoseSignalAFrozenProcessTook: a job pushed
// ready, which no holder made ready, may lose its signal to a process
// that froze as it took it. Each safety poll, a bucket's holder looks at
// every topic with ready jobs, and gives such a job a signal once it has
// waited a second: a consumer blocked in a started process, whose blocked
// call's end looks for nothing, takes the job long before that end.
func TestAHolderSignalsAPushedJobWhoseSignalAFrozenProcessTook(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		if be.mini != nil {
			t.Skip("miniredis lists no blocked clients")
		}
		ctx := context.Background()
		name := uniqueName(t)
		holder := newQueue(t, be.client, WithName(name), WithSafetyPoll(100*time.Millisecond))
		startQueue(t, holder)
		const id = "pushed-ready"
		b, err := bucketOfID(id, holder.opts.buckets)
		require.NoError(t, err)
		node, swallowed := frozenOn(t, be, holder.keys.bucket(b).signals("t"))
		other := newQueue(t, be.client, WithName(name))
		startQueue(t, other)
		got := make(chan string, 1)
		go func() {
			job, err := other.Pop(ctx, "t", blockFor/2)
			if err != nil {
				got <- err.Error()
				return
			}
			got <- job.ID
		}()
		require.Eventually(t, func() bool { return blockedFor(other, "t") && blockedOn(t, node, "") >= 2 }, 10*time.Second, time.Millisecond)
		_, err = holder.Push(ctx, &Job{ID: id, Topic: "t"})
		require.NoError(t, err)
		require.NoError(t, <-swallowed, "the job's signal went to the frozen process")
		assert.Equal(t, id, <-got, "the waiting consumer took the job all the same")
	})
}

// A job behind more traces than the holder's look reads, whose signal was
// lost, gets one all the same, for the counts say the list holds ready
// jobs: the consumer it wakes drops the traces. Here a consumer of a
// started process waits, its last look having found the list dry, while
// the signals of ten jobs pushed go with a process that dies, and eight
// of the jobs are removed.
func TestAJobBehindManyTracesWhoseSignalWasLostIsSignalled(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		name := uniqueName(t)
		q := newQueue(t, be.client, WithName(name), WithBuckets(1), WithSafetyPoll(100*time.Millisecond))
		startQueue(t, q)
		p := newQueue(t, be.client, WithName(name), WithBuckets(1))
		_, err := q.Pop(ctx, "t", 0)
		require.ErrorIs(t, err, ErrNoJob, "the list is dry, as q knows")
		var ids []string
		for range 10 {
			ids = append(ids, pushed(t, p, &Job{Topic: "t"}))
		}
		require.NoError(t, be.client.Del(ctx, q.keys.bucket(0).signals("t")).Err()) // lost
		for _, id := range ids[:8] {
			require.NoError(t, p.Remove(ctx, id))
		}
		job, err := q.Pop(ctx, "t", blockFor/2)
		require.NoError(t, err, "the job behind the traces is taken before the blocked call's wait ends")
		assert.Contains(t, ids[8:], job.ID)
	})
}

// The standby looks for lost signals at every topic too: the process that
// took a signal and froze may be the holder, whose looks stop with it.
func TestTheStandbyLooksForLostSignals(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		_, err := q.moveDue(ctx, 0, "holder", false)
		require.NoError(t, err)
		pushed(t, q, &Job{Topic: "t"})
		signals := q.keys.bucket(0).signals("t")
		require.NoError(t, be.client.Del(ctx, signals).Err()) // lost
		require.Eventually(t, func() bool {
			res, err := q.moveDue(ctx, 0, "standby", false, everyTopic)
			require.NoError(t, err)
			require.Equal(t, roleStandby, res.role)
			return be.client.LLen(ctx, signals).Val() == 1
		}, 10*time.Second, 10*time.Millisecond, "once the job has waited a second")
		res, err := q.moveDue(ctx, 0, "standby", false, everyTopic)
		require.NoError(t, err)
		assert.Equal(t, roleStandby, res.role)
		assert.EqualValues(t, 1, be.client.LLen(ctx, signals).Val(), "one signal, not one per look")
	})
}

// TestAHolderLooksPastTracesForAJobWhoseSignalWasLost: the holder's look
// for a lost signal finds the first ready job of the list past the traces
// of jobs that left it, gives it a signal once it has waited a second with
// none left, and says so, to look again.
func TestAHolderLooksPastTracesForAJobWhoseSignalWasLost(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		gone := pushed(t, q, &Job{Topic: "t"})
		waiting := pushed(t, q, &Job{Topic: "t"})
		require.NoError(t, q.Remove(ctx, gone)) // its entry stays at the head
		signals := q.keys.bucket(0).signals("t")
		require.NoError(t, be.client.Del(ctx, signals).Err()) // lost
		res, err := q.moveDue(ctx, 0, "token", false, "t")
		require.NoError(t, err)
		assert.Empty(t, res.signaled, "not before the job has waited a second")
		require.Eventually(t, func() bool {
			res, err := q.moveDue(ctx, 0, "token", false, "t")
			require.NoError(t, err)
			return slices.Equal(res.signaled, []string{"t"})
		}, 10*time.Second, 10*time.Millisecond)
		assert.EqualValues(t, 1, be.client.LLen(ctx, signals).Val(), "one signal")
		job, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err)
		assert.Equal(t, waiting, job.ID)
		res, err = q.moveDue(ctx, 0, "token", false, "t")
		require.NoError(t, err)
		assert.Empty(t, res.signaled, "none waits now")
	})
}

// The end of a blocked call's wait has a consumer look again at the call's
// own buckets, not at every bucket: on a Cluster each bucket has a call of
// its own, and each ending looked at all of them, eight looks where one
// was due (an idle worker on 8 buckets sent 0.73 reserve calls a second,
// then 0.41).
func TestABlockedCallsEndLooksAgainAtItsOwnBuckets(t *testing.T) {
	q := newQueue(t, miniredisClient(t), WithBuckets(4))
	w, err := q.waiting()
	require.NoError(t, err)
	wt := &waiter{wake: make(chan wakeUp, 1), want: 1}
	w.mu.Lock()
	tw := w.topicLocked("t")
	for b := range tw.avail {
		tw.avail[b] = 0 // each said: no signal, no job
	}
	tw.waiters = append(tw.waiters, wt)
	w.mu.Unlock()
	w.expired(&waitGroup{buckets: []int{2}})
	assert.Equal(t, wakeUp{b: noSignal}, <-wt.wake)
	w.mu.Lock()
	defer w.mu.Unlock()
	assert.Equal(t, []int{0, 0, unknown, 0}, tw.avail)
}

// In a started process, the end of a blocked call's wait looks only where
// a topic was paused, should its resume have been missed: the holders
// look for lost signals at every topic (everyTopic), one look per bucket,
// where each process's looks made one per process and bucket.
func TestAStartedProcesssBlockedCallsEndLooksOnlyAtPausedTopics(t *testing.T) {
	q := newQueue(t, miniredisClient(t), WithBuckets(2))
	startQueue(t, q)
	w, err := q.waiting()
	require.NoError(t, err)
	idle := &waiter{wake: make(chan wakeUp, 1), want: 1}
	paused := &waiter{wake: make(chan wakeUp, 1), want: 1}
	w.mu.Lock()
	for topic, wt := range map[string]*waiter{"idle": idle, "paused": paused} {
		tw := w.topicLocked(topic)
		tw.avail[0], tw.avail[1] = 0, 0
		tw.waiters = append(tw.waiters, wt)
		tw.paused = topic == "paused"
	}
	w.mu.Unlock()
	w.expired(&waitGroup{buckets: []int{0, 1}})
	assert.Equal(t, wakeUp{b: noSignal}, <-paused.wake, "the paused topic is read again")
	assert.Empty(t, idle.wake, "no look for a lost signal")
	w.mu.Lock()
	defer w.mu.Unlock()
	assert.Equal(t, []int{0, 0}, w.topics["idle"].avail, "what the last reply said stands")
	assert.False(t, w.topics["paused"].paused)
}

// A call that takes a job long after it was ready, and leaves no signal
// for the job behind it, gives that job one: the job taken was taken on
// the job behind's signal, its own having gone with a process that froze
// or died as it took it. Under a steady flow no job waits the second
// after which a job gets a signal anyway, and every later job would be
// taken on the signal of the one after it, late by an arrival.
func TestAJobTakenLateLeavesASignalForTheJobBehind(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		pushedAt := time.Now()
		late := pushed(t, q, &Job{Topic: "t"})
		pushed(t, q, &Job{Topic: "t"})
		signals := q.keys.bucket(0).signals("t")
		require.NoError(t, be.client.Del(ctx, signals).Err()) // one lost, one taken by the caller below
		require.Eventually(t, func() bool { return time.Since(pushedAt) > 100*time.Millisecond }, time.Minute, time.Millisecond,
			"the jobs have been ready a while, not yet a second")
		c, err := q.reserve(ctx, 0, "t", 1, 1, reserveSignalled)
		require.NoError(t, err)
		require.Len(t, c.jobs, 1)
		assert.Equal(t, late, c.jobs[0].ID, "oldest first")
		assert.EqualValues(t, 1, be.client.LLen(ctx, signals).Val(), "a signal for the job behind")
		assert.Equal(t, 1, c.left)
	})
}
