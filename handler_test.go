package delayqueue

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDeliveredWhenDueNeverEarly(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		startQueue(t, q)
		due := map[string]int64{}
		for i := range 50 {
			id := pushed(t, q, &Job{Topic: "t", Delay: time.Duration(i*7) * time.Millisecond, TTR: time.Minute})
			job, err := q.Get(ctx, id)
			require.NoError(t, err)
			if job.State == StateDelayed {
				due[id] = job.RunAt.UnixMilli()
			}
		}
		for range 50 {
			job, err := q.Pop(ctx, "t", time.Minute)
			require.NoError(t, err)
			reservedAt := job.ReservedUntil.Add(-job.TTR).UnixMilli()
			if d, ok := due[job.ID]; ok {
				assert.GreaterOrEqual(t, reservedAt, d, "job %s reserved before it was due (server clock)", job.ID)
			}
			require.NoError(t, q.Finish(ctx, job.ID))
		}
	})
}

func TestHandlerIsWokenByAnEarlierPush(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		// The handler renews its lease and polls only every 20 minutes, so
		// a job due in 100ms arrives within the Pop's timeout only if its
		// push woke the handler.
		q := newQueue(t, be.client, WithSafetyPoll(time.Hour), WithLease(time.Hour), WithBuckets(1))
		startQueue(t, q)
		pushed(t, q, &Job{Topic: "t", Delay: time.Hour})
		id := pushed(t, q, &Job{Topic: "t", Delay: 100 * time.Millisecond})
		job, err := q.Pop(ctx, "t", time.Minute)
		require.NoError(t, err)
		assert.Equal(t, id, job.ID)
	})
}

func TestUnfinishedJobIsDeliveredAgainAfterTTR(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		startQueue(t, q)
		ids := map[string]bool{}
		for range 20 {
			ids[pushed(t, q, &Job{Topic: "t", TTR: 200 * time.Millisecond, Body: []byte("x")})] = true
		}
		// A consumer pops every job and never finishes any.
		for range 20 {
			job, err := q.Pop(ctx, "t", time.Minute)
			require.NoError(t, err)
			assert.Equal(t, 1, job.Attempts)
		}
		// Each comes back once its TTR has run out, with one more attempt.
		again := map[string]bool{}
		for range 20 {
			job, err := q.Pop(ctx, "t", time.Minute)
			require.NoError(t, err)
			assert.Equal(t, 2, job.Attempts)
			assert.Equal(t, []byte("x"), job.Body)
			again[job.ID] = true
			require.NoError(t, q.Finish(ctx, job.ID))
		}
		assert.Equal(t, ids, again)
		_, err := q.Pop(ctx, "t", 0)
		assert.ErrorIs(t, err, ErrNoJob)
	})
}

// consume pops and finishes jobs with workers goroutines until n jobs have
// arrived, counting deliveries per ID.
func consume(t *testing.T, qs []*DelayQueue, topic string, workers, n int) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var mu sync.Mutex
	seen := map[string]int{}
	total := 0
	var wg sync.WaitGroup
	for _, q := range qs {
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					job, err := q.Pop(ctx, topic, 200*time.Millisecond)
					if err != nil {
						continue
					}
					if err := q.Finish(ctx, job.ID); err != nil {
						t.Errorf("finish %s: %v", job.ID, err)
					}
					mu.Lock()
					seen[job.ID]++
					total++
					if total == n {
						cancel()
					}
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	return seen
}

func TestTwoQueuesOnOneRedisDeliverEveryJobOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		name := uniqueName(t)
		var qs []*DelayQueue
		for range 2 {
			q := newQueue(t, be.client, WithName(name), WithDefaultTTR(time.Hour))
			startQueue(t, q)
			qs = append(qs, q)
		}
		const perQueue = 3000
		var pushedIDs sync.Map
		var wg sync.WaitGroup
		for _, q := range qs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range perQueue {
					id, err := q.Push(ctx, &Job{Topic: "t", Delay: time.Duration(rand.IntN(500)) * time.Millisecond})
					if !assert.NoError(t, err) {
						return
					}
					pushedIDs.Store(id, true)
				}
			}()
		}
		seen := consume(t, qs, "t", 4, 2*perQueue)
		wg.Wait()
		assert.Len(t, seen, 2*perQueue, "every job delivered")
		pushedIDs.Range(func(id, _ any) bool {
			assert.Equal(t, 1, seen[id.(string)], "job %s delivered once", id)
			return true
		})
		for _, q := range qs {
			_, err := q.Pop(ctx, "t", 0)
			assert.ErrorIs(t, err, ErrNoJob, "nothing left over")
		}
	})
}

func TestJobsSurviveCloseAndReopen(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		name := uniqueName(t)
		q, err := New(be.client, WithName(name), WithLogger(discard))
		require.NoError(t, err)
		startQueue(t, q)
		for i := range 100 {
			pushed(t, q, &Job{Topic: "t", Delay: time.Duration(i%2) * 300 * time.Millisecond})
		}
		closeQueue(t, q)
		_, err = q.Push(context.Background(), &Job{Topic: "t"})
		assert.ErrorIs(t, err, ErrClosed)

		reopened := newQueue(t, be.client, WithName(name))
		startQueue(t, reopened)
		seen := consume(t, []*DelayQueue{reopened}, "t", 4, 100)
		assert.Len(t, seen, 100)
	})
}

func TestHandlersSurviveARedisOutage(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	logs := &capture{}
	q := newQueue(t, c, WithLogger(logs.logger()), WithBuckets(2))
	startQueue(t, q)

	s.Kill()
	require.Eventually(t, func() bool {
		return containsAll(logs.String(), "cannot move due jobs")
	}, 30*time.Second, 10*time.Millisecond, "the handlers notice the outage")
	require.NoError(t, s.Restart())

	// The queue's data was lost with the server (no persistence here); New
	// records the bucket count again, and the running handlers and pub/sub
	// connection recover on their own.
	_, err := New(c, WithName(q.opts.name), WithBuckets(2), WithLogger(discard))
	require.NoError(t, err)
	id := pushed(t, q, &Job{Topic: "t", Delay: 100 * time.Millisecond})
	job, err := q.Pop(ctx, "t", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, id, job.ID)
	require.Eventually(t, func() bool { return containsAll(logs.String(), "moves due jobs again") },
		30*time.Second, 10*time.Millisecond)
}
