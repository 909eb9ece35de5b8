package delayqueue

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// consumeUntil runs Consume until stop reports true, then cancels it and
// waits for it to return.
func consumeUntil(t *testing.T, q *DelayQueue, h Handler, opts ConsumeOptions, stop func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- q.Consume(ctx, "t", h, opts) }()
	require.Eventually(t, stop, time.Minute, 5*time.Millisecond)
	cancel()
	require.NoError(t, <-errc)
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
			dead, err := q.DeadJobs(ctx, "t", 10)
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

func TestConsumeRunsMiddlewareOutermostFirst(t *testing.T) {
	c := miniredisClient(t)
	q := newQueue(t, c)
	pushed(t, q, &Job{Topic: "t"})
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
	var done atomic.Bool
	h := func(context.Context, *Job) error {
		mu.Lock()
		order = append(order, "handler")
		mu.Unlock()
		done.Store(true)
		return nil
	}
	consumeUntil(t, q, h, ConsumeOptions{Middleware: []Middleware{mw("outer"), mw("inner")}}, done.Load)
	assert.Equal(t, []string{"outer", "inner", "handler"}, order)
}

func TestConsumeRejectsBadArguments(t *testing.T) {
	c := miniredisClient(t)
	q := newQueue(t, c)
	ctx := context.Background()
	h := func(context.Context, *Job) error { return nil }
	assert.ErrorIs(t, q.Consume(ctx, "", h, ConsumeOptions{}), ErrInvalidTopic)
	assert.ErrorIs(t, q.Consume(ctx, "t", nil, ConsumeOptions{}), ErrInvalidOption)
	assert.ErrorIs(t, q.Consume(ctx, "t", h, ConsumeOptions{Concurrency: -1}), ErrInvalidOption)
	assert.ErrorIs(t, q.Consume(ctx, "t", h, ConsumeOptions{Middleware: []Middleware{nil}}), ErrInvalidOption)
	closeQueue(t, q)
	assert.ErrorIs(t, q.Consume(ctx, "t", h, ConsumeOptions{}), ErrClosed)
}

func TestConsumeSettlesRunningJobsAfterClose(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		bg := context.Background()
		name := uniqueName(t)
		q, err := New(be.client, WithName(name), WithLogger(discard), WithDefaultTTR(time.Hour))
		require.NoError(t, err)
		id := pushed(t, q, &Job{Topic: "t"})
		started, release := make(chan struct{}), make(chan struct{})
		errc := make(chan error, 1)
		go func() {
			errc <- q.Consume(bg, "t", func(ctx context.Context, job *Job) error {
				close(started)
				<-release
				return nil
			}, ConsumeOptions{})
		}()
		<-started
		closeQueue(t, q) // Close stops Consume, but not the running handler
		close(release)
		assert.ErrorIs(t, <-errc, ErrClosed)

		other := newQueue(t, be.client, WithName(name))
		_, err = other.Get(bg, id)
		assert.ErrorIs(t, err, ErrNotFound, "the handler's success still finished the job")
	})
}
