package delayqueue

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The reservation that takes over a finished job's grant reserves nothing
// while that job is still reserved: a finish that did not run before it
// (a script not loaded, another order) never lets two jobs share a grant.
func TestHandOnReservesNothingWhileThePreviousJobIsReserved(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithName(uniqueName(t)), WithBuckets(1))
		startQueue(t, q)
		pushed(t, q, &Job{Topic: "t"})
		pushed(t, q, &Job{Topic: "t"})
		first, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err)

		after := func() []*Job {
			c := q.reserveCall(0, "t", 1, 0, true, first.ID, first.reservation)
			q.sendCalls(ctx, []*scriptCall{c})
			jobs, _, _, err := q.reserved(ctx, 0, "t", c)
			require.NoError(t, err)
			return jobs
		}
		assert.Empty(t, after(), "the first job still holds the grant")
		require.NoError(t, q.Finish(ctx, first.ID))
		jobs := after()
		require.Len(t, jobs, 1, "the first job finished: its grant is free")
		assert.NotEqual(t, first.ID, jobs[0].ID)
	})
}

// Under a concurrency limit, handlers that finish hand their grants on to
// the next jobs: every job runs once, never more at once than the limit,
// as the handlers count themselves.
func TestConsumeHandsGrantsOnWithinTheLimit(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		q := newQueue(t, be.client, WithName(uniqueName(t)), WithBuckets(2))
		startQueue(t, q)
		require.NoError(t, q.SetLimits(ctx, "t", Limits{Concurrency: 2}))
		const n = 40
		for range n {
			pushed(t, q, &Job{Topic: "t"})
		}
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
