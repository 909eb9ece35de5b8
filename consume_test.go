package delayqueue

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// consumeUntil runs Consume until stop reports true, then cancels it and
// waits for it to return.
func consumeUntil(t *testing.T, q *DelayQueue, h Handler, opts ConsumeOptions, stop func() bool) {
	t.Helper()
	end := consumeInBackground(t, q, h, opts)
	require.Eventually(t, stop, time.Minute, 5*time.Millisecond)
	end()
}

// consumeInBackground runs Consume of topic "t"; stop ends it and waits for
// it to return.
func consumeInBackground(t *testing.T, q *DelayQueue, h Handler, opts ConsumeOptions) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- q.Consume(ctx, "t", h, opts) }()
	return func() {
		cancel()
		require.NoError(t, <-errc)
	}
}

// awaitGone waits until none of ids is in q: each was finished.
func awaitGone(t *testing.T, q *DelayQueue, ids ...string) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, id := range ids {
			if _, err := q.Get(context.Background(), id); !errors.Is(err, ErrNotFound) {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond, "finished")
}

func TestConsumeFinishesRetriesAndRecoversPanics(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBackoff(BackoffSchedule(0)), WithMaxAttempts(2))
		startQueue(t, q)
		ok := pushed(t, q, &Job{Topic: "t", Body: []byte("ok")})
		flaky := pushed(t, q, &Job{Topic: "t", Body: []byte("flaky")})
		broken := pushed(t, q, &Job{Topic: "t", Body: []byte("panic")})

		var mu sync.Mutex
		calls := map[string]int{}
		finished := map[string]bool{}
		h := func(ctx context.Context, job *Job) error {
			mu.Lock()
			calls[job.ID]++
			n := calls[job.ID]
			mu.Unlock()
			switch string(job.Body) {
			case "flaky":
				if n == 1 {
					return errors.New("first try fails")
				}
			case "panic":
				panic("boom")
			}
			mu.Lock()
			finished[job.ID] = true
			mu.Unlock()
			return nil
		}
		consumeUntil(t, q, h, ConsumeOptions{Concurrency: 2}, func() bool {
			dead, err := listJobs(ctx, q, "t", StateDead, 10)
			mu.Lock()
			defer mu.Unlock()
			return err == nil && len(dead) == 1 && finished[ok] && finished[flaky]
		})
		for _, id := range []string{ok, flaky} {
			_, err := q.Get(ctx, id)
			assert.ErrorIs(t, err, ErrNotFound, "a job whose handler succeeded is finished")
		}
		dead, err := q.Get(ctx, broken)
		require.NoError(t, err)
		assert.Equal(t, StateDead, dead.State)
		assert.Equal(t, 2, dead.Attempts)
		assert.True(t, strings.HasPrefix(dead.LastError, "delayqueue: handler panicked: boom"), dead.LastError)
		assert.Equal(t, map[string]int{ok: 1, flaky: 2, broken: 2}, calls)
	})
}

func TestConsumeBoundsConcurrency(t *testing.T) {
	c := miniredisClient(t)
	q := newQueue(t, c)
	for range 40 {
		pushed(t, q, &Job{Topic: "t"})
	}
	var running, most, done atomic.Int64
	full := make(chan struct{}) // closed once three handlers run at once
	var once sync.Once
	h := func(ctx context.Context, job *Job) error {
		n := running.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		if n == 3 {
			once.Do(func() { close(full) })
		}
		<-full // the first handlers wait until three overlap
		running.Add(-1)
		done.Add(1)
		return nil
	}
	consumeUntil(t, q, h, ConsumeOptions{Concurrency: 3}, func() bool { return done.Load() == 40 })
	assert.Equal(t, int64(3), most.Load(), "three handlers ran at once, never more")
}

func TestConsumeShutdownReleasesUnfinishedJobsAtOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		defer verifyNoLeaks(t)()
		bg := context.Background()
		q, err := New(be.client, WithName(uniqueName(t)), WithLogger(discard), WithDefaultTTR(time.Hour))
		require.NoError(t, err)
		defer closeQueue(t, q)
		quick := pushed(t, q, &Job{Topic: "t", Body: []byte("quick")})
		slow := pushed(t, q, &Job{Topic: "t", Body: []byte("slow")})

		started := make(chan struct{}, 2)
		release := make(chan struct{})
		h := func(ctx context.Context, job *Job) error {
			started <- struct{}{}
			if string(job.Body) == "quick" {
				<-release // finishes within the grace period
				return nil
			}
			<-ctx.Done() // only stops when its context ends
			return ctx.Err()
		}
		ctx, cancel := context.WithCancel(bg)
		errc := make(chan error, 1)
		go func() { errc <- q.Consume(ctx, "t", h, ConsumeOptions{Concurrency: 2, Grace: 200 * time.Millisecond}) }()
		<-started
		<-started
		cancel()
		close(release)
		require.NoError(t, <-errc)

		_, err = q.Get(bg, quick)
		assert.ErrorIs(t, err, ErrNotFound, "a handler that ends within the grace period finishes its job")
		job, err := q.Get(bg, slow)
		require.NoError(t, err)
		assert.Equal(t, StateReady, job.State, "an unfinished job is ready again at once, not after its hour-long TTR")
		assert.Equal(t, 0, job.Attempts, "and the interrupted attempt does not count")
	})
}

func TestConsumeGoesOnAfterAHandlerEndsItsGoroutine(t *testing.T) {
	c := miniredisClient(t)
	q := newQueue(t, c)
	for range 5 {
		pushed(t, q, &Job{Topic: "t"})
	}
	var calls, done atomic.Int64
	h := func(ctx context.Context, job *Job) error {
		if calls.Add(1) <= 3 {
			runtime.Goexit() // as t.FailNow does in a test's handler
		}
		done.Add(1)
		return nil
	}
	// Three goroutines ended with their slots held would stop a Consume
	// of one slot and two workers for good.
	consumeUntil(t, q, h, ConsumeOptions{Concurrency: 1}, func() bool { return done.Load() == 2 })
}

func TestConsumeRunsMiddlewareOutermostFirst(t *testing.T) {
	var mu sync.Mutex
	var order []string
	mw := func(name string) Middleware {
		return func(next Handler) Handler {
			return func(ctx context.Context, job *Job) error {
				mu.Lock()
				order = append(order, name)
				mu.Unlock()
				return next(ctx, job)
			}
		}
	}
	// The queue's middleware wraps every handler, in the order given.
	q := newQueue(t, miniredisClient(t), WithConsumeMiddleware(mw("queue 1"), mw("queue 2")),
		WithConsumeMiddleware(mw("queue 3")))
	pushed(t, q, &Job{Topic: "t"})
	var done atomic.Bool
	h := func(context.Context, *Job) error {
		mu.Lock()
		order = append(order, "handler")
		mu.Unlock()
		done.Store(true)
		return nil
	}
	consumeUntil(t, q, mw("outer")(mw("inner")(h)), ConsumeOptions{}, done.Load)
	assert.Equal(t, []string{"queue 1", "queue 2", "queue 3", "outer", "inner", "handler"}, order)
}

func TestConsumeRejectsBadArguments(t *testing.T) {
	c := miniredisClient(t)
	q := newQueue(t, c)
	ctx := context.Background()
	h := func(context.Context, *Job) error { return nil }
	assert.ErrorIs(t, q.Consume(ctx, "", h, ConsumeOptions{}), ErrInvalidTopic)
	assert.ErrorIs(t, q.Consume(ctx, "t", nil, ConsumeOptions{}), ErrInvalidOption)
	assert.ErrorIs(t, q.Consume(ctx, "t", h, ConsumeOptions{Concurrency: -1}), ErrInvalidOption)
	closeQueue(t, q)
	assert.ErrorIs(t, q.Consume(ctx, "t", h, ConsumeOptions{}), ErrClosed)
}

// consumeAsync runs Consume of topic "t" with h in the background, until
// the test closes the queue; Consume's error comes on the channel.
func consumeAsync(q *DelayQueue, h Handler, opts ConsumeOptions) <-chan error {
	errc := make(chan error, 1)
	go func() { errc <- q.Consume(context.Background(), "t", h, opts) }()
	return errc
}

// closeAsync closes q in the background; the channel closes when Close
// has returned.
func closeAsync(t *testing.T, q *DelayQueue) <-chan struct{} {
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		closeQueue(t, q)
	}()
	return closed
}

// queueToClose opens a queue of the test's own name that the test closes
// itself, with jobs that stay reserved an hour.
func queueToClose(t *testing.T, be backend) (*DelayQueue, string) {
	t.Helper()
	name := uniqueName(t)
	q, err := New(be.client, WithName(name), WithLogger(discard), WithDefaultTTR(time.Hour))
	require.NoError(t, err)
	return q, name
}

func TestConsumeSettlesRunningJobsAfterClose(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		bg := context.Background()
		q, name := queueToClose(t, be)
		id := pushed(t, q, &Job{Topic: "t"})
		started, release := make(chan struct{}), make(chan struct{})
		errc := consumeAsync(q, func(ctx context.Context, job *Job) error {
			close(started)
			<-release
			return nil
		}, ConsumeOptions{})
		<-started
		closed := closeAsync(t, q) // Close stops Consume, and waits for its running handler
		close(release)
		<-closed
		// Close waited for Consume: the job is settled once it returns.
		other := newQueue(t, be.client, WithName(name))
		_, err := other.Get(bg, id)
		assert.ErrorIs(t, err, ErrNotFound, "the handler's success still finished the job")
		assert.ErrorIs(t, <-errc, ErrClosed)
	})
}

// TestCloseEndsAConsumeWhoseHandlersAreAllBusy: a Consume with no free
// slot still ends at Close, as when its ctx ends: its handler gets Grace,
// then its job goes back to ready for another consumer, and Close returns
// only after all that.
func TestCloseEndsAConsumeWhoseHandlersAreAllBusy(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		bg := context.Background()
		q, name := queueToClose(t, be)
		startQueue(t, q)
		busy := pushed(t, q, &Job{Topic: "t"})
		started := make(chan struct{})
		var ended atomic.Value
		errc := consumeAsync(q, func(ctx context.Context, job *Job) error {
			close(started)
			<-ctx.Done() // busy until told to stop
			ended.Store(context.Cause(ctx))
			return ctx.Err()
		}, ConsumeOptions{Concurrency: 1, Grace: 50 * time.Millisecond})
		<-started
		closeQueue(t, q)
		// Close waited for Consume: its handler has ended and its job is
		// back by the time Close returns.
		require.NotNil(t, ended.Load(), "the handler's ctx ended")
		other := newQueue(t, be.client, WithName(name))
		job, err := other.Get(bg, busy)
		require.NoError(t, err)
		assert.Equal(t, StateReady, job.State, "the job went back to ready")
		assert.Equal(t, 0, job.Attempts, "without counting its attempt")
		assert.ErrorIs(t, <-errc, ErrClosed)
	})
}

// TestCloseFinishesTheJobOfALimitedTopicAndGivesItsSlotBack: a handler of
// a topic at its concurrency limit that succeeds after Close finishes its
// job and gives the slot back, rather than handing the slot on to a next
// job that Close forbids taking.
func TestCloseFinishesTheJobOfALimitedTopicAndGivesItsSlotBack(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		bg := context.Background()
		q, name := queueToClose(t, be)
		startQueue(t, q)
		require.NoError(t, q.SetLimits(bg, "t", Limits{Concurrency: 1}))
		first := pushed(t, q, &Job{Topic: "t"})
		second := pushed(t, q, &Job{Topic: "t"})
		started, release := make(chan string, 2), make(chan struct{})
		errc := consumeAsync(q, func(ctx context.Context, job *Job) error {
			started <- job.ID
			<-release
			return nil
		}, ConsumeOptions{Concurrency: 1})
		running := <-started
		closed := closeAsync(t, q)
		require.Eventually(t, func() bool { return q.closed.Load() }, 10*time.Second, time.Millisecond)
		close(release)
		<-closed
		assert.ErrorIs(t, <-errc, ErrClosed)

		other := newQueue(t, be.client, WithName(name))
		_, err := other.Get(bg, running)
		assert.ErrorIs(t, err, ErrNotFound, "the job was finished")
		job, err := other.Pop(bg, "t", 0)
		require.NoError(t, err, "its slot was given back")
		assert.Equal(t, map[string]bool{first: true, second: true}, map[string]bool{running: true, job.ID: true})
	})
}

// work stands for a handler's work: it takes d, or ends with ctx.
func work(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func TestConsumeEndsAHandlerAtMaxRunTime(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBackoff(BackoffSchedule(0)))
		startQueue(t, q)
		id := pushed(t, q, &Job{Topic: "t", TTR: 100 * time.Millisecond})
		var mu sync.Mutex
		var causes []error
		var done atomic.Bool
		h := func(ctx context.Context, job *Job) error {
			mu.Lock()
			first := len(causes) == 0
			mu.Unlock()
			if !first {
				done.Store(true)
				return nil
			}
			<-ctx.Done() // a handler stuck until its ctx ends
			mu.Lock()
			causes = append(causes, context.Cause(ctx))
			mu.Unlock()
			return ctx.Err()
		}
		consumeUntil(t, q, h, ConsumeOptions{MaxRunTime: 400 * time.Millisecond}, func() bool {
			_, err := q.Get(ctx, id)
			return done.Load() && errors.Is(err, ErrNotFound)
		})
		require.Len(t, causes, 1)
		assert.ErrorIs(t, causes[0], context.DeadlineExceeded, "its ctx ended at MaxRunTime, not at the TTR")
	})
}

func TestConsumeEndsTheHandlerOfARemovedJob(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		id := pushed(t, q, &Job{Topic: "t", TTR: 150 * time.Millisecond})
		running := make(chan struct{})
		cause := make(chan error, 1)
		h := func(ctx context.Context, job *Job) error {
			close(running)
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return ctx.Err()
		}
		var got error
		consumeUntil(t, q, h, ConsumeOptions{}, func() bool {
			select {
			case <-running:
			default:
				return false
			}
			_ = q.Remove(ctx, id) // the order was paid while its cancellation ran
			select {
			case got = <-cause:
				return true
			default:
				return false
			}
		})
		assert.ErrorIs(t, got, ErrNotFound, "the handler's ctx ends, saying why")
	})
}

// TestFaultConsumerProcessRunsALongJobOnce runs Consume in a worker process
// of its own, on a job that takes 3.5 times its TTR, while this process,
// which never consumes, moves due jobs (and expired reservations).
func TestFaultConsumerProcessRunsALongJobOnce(t *testing.T) {
	s, name, q := startedQueue(t)
	const ttr = 300 * time.Millisecond
	id := pushed(t, q, &Job{Topic: "t", TTR: ttr})
	worker := startChild(t, "consume", s.Addr, name, "DQ_RUN="+(3*ttr+ttr/2).String())
	worker.expect(t, "start "+id+" 1")
	worker.expect(t, "done "+id)
	require.Eventually(t, func() bool {
		_, err := q.Get(context.Background(), id)
		return errors.Is(err, ErrNotFound)
	}, 30*time.Second, 5*time.Millisecond, "the job is finished")
	worker.signal(t, syscall.SIGKILL)
	_ = worker.cmd.Wait() // its output is complete
	assert.False(t, worker.out.Scan(), "no second start: %q", worker.out.Text())
	t.Logf("FAULT worker process, job of 3.5 x TTR: ran once, finished")
}

// TestFaultKilledConsumerProcesssJobComesBack kills a worker process in the
// middle of a job: the job is delivered again once its TTR runs out.
func TestFaultKilledConsumerProcessesJobComesBack(t *testing.T) {
	s, name, q := startedQueue(t)
	const ttr = 500 * time.Millisecond
	id := pushed(t, q, &Job{Topic: "t", TTR: ttr})
	worker := startChild(t, "consume", s.Addr, name, "DQ_RUN=1h")
	worker.expect(t, "start "+id+" 1")
	killed := time.Now()
	worker.signal(t, syscall.SIGKILL)
	job, err := q.Pop(context.Background(), "t", time.Minute)
	require.NoError(t, err)
	back := time.Since(killed)
	assert.Equal(t, id, job.ID)
	assert.Equal(t, 2, job.Attempts)
	assert.Contains(t, job.LastError, "reservation ran out")
	require.NoError(t, q.Finish(context.Background(), id))
	t.Logf("FAULT worker process SIGKILLed mid-job (TTR %v): delivered again %v after the kill", ttr, back.Round(time.Millisecond))
}

// consumeHelper consumes topic "t", each job taking DQ_RUN, and says when a
// handler starts ("start <id> <attempt>") and when it is done.
func consumeHelper(q *DelayQueue) int {
	run, _ := time.ParseDuration(os.Getenv("DQ_RUN"))
	err := q.Consume(context.Background(), "t", func(ctx context.Context, job *Job) error {
		fmt.Println("start", job.ID, job.Attempts)
		if err := work(ctx, run); err != nil {
			return err
		}
		fmt.Println("done", job.ID)
		return nil
	}, ConsumeOptions{Concurrency: 4})
	fmt.Println("error", err)
	return 1
}

// Consume backs off for failures in a row only: a pop that found nothing
// (ErrNoJob) ends a run, so that failures now and then, as a connection
// cut makes them on a quiet topic, never grow the wait.
func TestConsumeBacksOffOnlyForErrorsInARow(t *testing.T) {
	var run errorRun
	for range 8 {
		assert.LessOrEqual(t, run.failed(), 50*time.Millisecond, "a first failure backs off the least")
		assert.Equal(t, errorRun(1), run)
		run.ended() // a pop found nothing
	}
	run.failed()
	run.failed()
	assert.Equal(t, errorRun(2), run, "failures in a row add up")
}

// The finishes of jobs whose handlers end together go in one script call:
// held for company until as many finishes wait as Consume has slots, or
// until a finish in a hurry takes them along. Without the wait, the first
// handler's finish goes alone and the rest after it. (With no slot to
// spare, the first slot freed reserves again at once, and that reserve
// call may take the finishes waiting along: then no finish call goes.)
func TestConsumeFinishesJobsEndedTogetherInOneCall(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		for _, spare := range []int{0, 1} { // slots beyond the jobs
			ctx := context.Background()
			finishes := &scriptCounter{script: scriptFinish}
			q := hookedQueue(t, be.client, finishes)
			q.settleWithin = time.Minute // however slowly the others come
			startQueue(t, q)
			const n = 4
			var ids []string
			for range n {
				ids = append(ids, pushed(t, q, &Job{Topic: "t"}))
			}
			other := pushed(t, q, &Job{Topic: "u"})
			var started sync.WaitGroup
			started.Add(n)
			release := make(chan struct{})
			h := func(ctx context.Context, job *Job) error {
				started.Done()
				<-release
				return nil
			}
			stop := consumeInBackground(t, q, h, ConsumeOptions{Concurrency: n + spare})
			started.Wait()
			close(release)
			if spare > 0 {
				require.Eventually(t, func() bool { return q.finishes.For(0).Queued() == n },
					10*time.Second, time.Millisecond, "the finishes wait for company")
				assert.Zero(t, finishes.n.Load())
				assert.ErrorIs(t, q.Finish(ctx, other), ErrNotReserved, "a finish in a hurry")
			}
			awaitGone(t, q, ids...)
			if spare > 0 {
				assert.EqualValues(t, 1, finishes.n.Load(), "one call for all, spare slots %d", spare)
			} else {
				assert.LessOrEqual(t, finishes.n.Load(), int64(1), "one call for all, or none beside the reserve calls")
			}
			stop()
		}
	})
}

// ridesSeen adds up the finishes that rode on reserve calls, as their
// events say.
type ridesSeen struct{ n atomic.Int64 }

func (r *ridesSeen) Observe(_ context.Context, e Event) {
	if e.Kind == EventReserveCall {
		r.n.Add(int64(e.Finishes))
	}
}

// Finishes that wait for company ride on the next reserve call of their
// bucket: the jobs are finished, and no finish call goes. Without the ride
// they would wait for company until the wait ends (a minute here).
func TestConsumeFinishesRideOnTheNextReserveCall(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		finishes := &scriptCounter{script: scriptFinish}
		reserves := &reserveCounter{}
		c := anotherClient(t, be.client)
		c.AddHook(finishes)
		c.AddHook(reserves)
		seen := &ridesSeen{}
		q := newQueue(t, c, WithBuckets(1), WithObserver(seen))
		q.settleWithin = time.Minute
		startQueue(t, q)
		const n = 4
		var ids []string
		for range n {
			ids = append(ids, pushed(t, q, &Job{Topic: "t"}))
		}
		var started sync.WaitGroup
		started.Add(n)
		release := make(chan struct{})
		var handled atomic.Int64
		h := func(ctx context.Context, job *Job) error {
			if handled.Add(1) <= n {
				started.Done()
				<-release
			}
			return nil
		}
		stop := consumeInBackground(t, q, h, ConsumeOptions{Concurrency: n + 1})
		started.Wait()
		close(release)
		require.Eventually(t, func() bool { return q.finishes.For(0).Queued() == n },
			10*time.Second, time.Millisecond, "the finishes wait for company")
		last := pushed(t, q, &Job{Topic: "t"})
		awaitGone(t, q, ids...)
		// The jobs are gone once the script ran; its reply is counted
		// when the client has read it.
		require.Eventually(t, func() bool { return reserves.rode.Load() == n }, 10*time.Second, time.Millisecond,
			"a reserve call took them")
		assert.Zero(t, finishes.n.Load(), "no finish call")
		require.Eventually(t, func() bool { return seen.n.Load() == n }, 10*time.Second, time.Millisecond,
			"the reserve call's event says it carried them")
		require.Eventually(t, func() bool { return handled.Load() == n+1 }, 10*time.Second, time.Millisecond)
		// The last job's finish may wait for company: one in a hurry
		// takes it along.
		other := pushed(t, q, &Job{Topic: "u"})
		assert.ErrorIs(t, q.Finish(ctx, other), ErrNotReserved)
		awaitGone(t, q, last)
		stop()
	})
}

// After a pop that filled every slot it asked for, the slots of handlers
// that end together go in one pop. Without the wait for them, the first
// slot freed pops alone and the others after its reply.
func TestConsumePopsForHandlersEndedTogetherInOneCall(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		reserves := &reserveCounter{}
		q := hookedQueue(t, be.client, reserves)
		q.gatherWithin = time.Minute // however slowly the slots come free
		startQueue(t, q)
		const n = 4
		for range 2 * n {
			pushed(t, q, &Job{Topic: "t"})
		}
		var started sync.WaitGroup
		started.Add(n)
		var handled atomic.Int64
		release := make(chan struct{})
		h := func(ctx context.Context, job *Job) error {
			if handled.Add(1) <= n {
				started.Done()
				<-release
			}
			return nil
		}
		stop := consumeInBackground(t, q, h, ConsumeOptions{Concurrency: n})
		started.Wait()
		before := reserves.found.Load()
		close(release)
		require.Eventually(t, func() bool { return handled.Load() == 2*n },
			10*time.Second, time.Millisecond, "every job handled")
		assert.EqualValues(t, 1, reserves.found.Load()-before,
			"one reserve call for the handlers ended together")
		stop()
	})
}
