package delayqueue

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A job that hands its grant on is finished by the reserve call that takes
// the next job: no finish call goes.
func TestHandOnFinishesInTheReserveCall(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		finishes := &scriptCounter{script: scriptFinish}
		q := hookedQueue(t, be.client, finishes)
		startQueue(t, q)
		require.NoError(t, q.SetLimits(ctx, "t", Limits{Concurrency: 1}))
		var ids []string
		for range 5 {
			ids = append(ids, pushed(t, q, &Job{Topic: "t"}))
		}
		stop := consumeInBackground(t, q, func(context.Context, *Job) error { return nil }, ConsumeOptions{Concurrency: 1})
		awaitGone(t, q, ids...)
		stop()
		assert.Zero(t, finishes.n.Load())
	})
}

// Under a concurrency limit, handlers that finish hand their grants on to
// the next jobs: every job runs once, never more at once than the limit,
// as the handlers count themselves.
func TestConsumeHandsGrantsOnWithinTheLimit(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		const n = 40
		q := limitedBacklog(t, be, 2, 2, n)
		var running, most atomic.Int32
		var mu sync.Mutex
		seen := map[string]int{}
		done := make(chan error, 1)
		go func() {
			done <- q.Consume(ctx, "t", func(_ context.Context, job *Job) error {
				now := running.Add(1)
				defer running.Add(-1)
				for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
				}
				mu.Lock()
				defer mu.Unlock()
				seen[job.ID]++
				if len(seen) == n {
					cancel()
				}
				return nil
			}, ConsumeOptions{Concurrency: 4})
		}()
		require.NoError(t, <-done)
		assert.Len(t, seen, n)
		for id, k := range seen {
			assert.Equal(t, 1, k, id)
		}
		assert.LessOrEqual(t, most.Load(), int32(2))
		c, err := q.Counts(context.Background(), "t")
		require.NoError(t, err)
		assert.Zero(t, c.Ready+c.Reserved)
	})
}

// A grant handed on over lowered limits is not renewed: the job reserved
// with it goes back to ready before the grant is given back, and from the
// lowering on the handlers never count more running than the new limit.
func TestLoweredLimitsHoldForAGrantHandedOn(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		const n = 5
		q := limitedBacklog(t, be, 1, 2, n+1)
		// One job popped and finished first: the server knows the
		// scripts of a hand-on, whose finish then runs before its reserve.
		first, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err)
		require.NoError(t, q.Finish(ctx, first.ID))
		var running, doneCount atomic.Int32
		var lowered atomic.Bool
		var overLimit atomic.Int32
		started := make(chan struct{}, n)
		proceed := make(chan struct{})
		consumed := make(chan error, 1)
		go func() {
			consumed <- q.Consume(ctx, "t", func(context.Context, *Job) error {
				if now := running.Add(1); lowered.Load() && now > 1 {
					overLimit.Add(1)
				}
				started <- struct{}{}
				<-proceed
				running.Add(-1)
				if doneCount.Add(1) == n {
					cancel()
				}
				return nil
			}, ConsumeOptions{Concurrency: 4})
		}()
		<-started
		<-started
		lowered.Store(true)
		require.NoError(t, q.SetLimits(context.Background(), "t", Limits{Concurrency: 1}))
		proceed <- struct{}{} // one returns; its grant cannot go on
		require.Eventually(t, func() bool {
			c, err := q.Counts(context.Background(), "t")
			return err == nil && c.Reserved == 1 && c.Ready == n-2
		}, 30*time.Second, time.Millisecond, "the job reserved with the grant went back to ready")
		close(proceed)
		require.NoError(t, <-consumed)
		assert.Zero(t, overLimit.Load(), "more running than the lowered limit")
		assert.Equal(t, int32(n), doneCount.Load())
	})
}

// limitedBacklog is a started queue of buckets buckets whose topic "t" has
// a concurrency limit conc and jobs ready jobs.
func limitedBacklog(t *testing.T, be backend, buckets, conc, jobs int) *DelayQueue {
	q := newQueue(t, be.client, WithName(uniqueName(t)), WithBuckets(buckets))
	startQueue(t, q)
	require.NoError(t, q.SetLimits(context.Background(), "t", Limits{Concurrency: conc}))
	for range jobs {
		pushed(t, q, &Job{Topic: "t"})
	}
	return q
}
