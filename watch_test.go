package delayqueue

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTopicWatch(t *testing.T) {
	w := newTopicWatch(4)
	pop := newWaiter()
	b := w.candidates(1, false, pop)
	assert.Equal(t, []int{1, 2, 3, 0}, b, "every bucket is a candidate at first")
	for _, b := range b {
		l := w.take(b, 1, false)
		assert.Equal(t, 1, l.n, "a bucket of unknown count is asked for what the Pop wants")
		w.settle(l, 0, listEmpty, nil)
	}
	assert.Empty(t, w.candidates(0, false, pop), "a bucket found empty is no candidate")
	assert.Equal(t, []int{2, 3, 0, 1}, w.candidates(2, true, pop), "all lists every bucket")
	assert.Equal(t, 1, w.take(2, 1, true).n, "all asks a bucket even when its count is 0")

	w.notify(2, 3)
	assert.Len(t, pop.wake, 1, "a notification wakes a waiter")
	assert.Equal(t, []int{2}, w.candidates(0, false, pop))
	l := w.take(2, 5, false)
	assert.Equal(t, 3, l.n, "a look asks for no more than the bucket's count")
	assert.Equal(t, 0, w.take(2, 1, false).n, "nor does the next, while the first looks")
	w.settle(l, 3, filled, nil)
	assert.Empty(t, w.candidates(0, false, pop))

	w.notify(1, 2)
	l = w.take(1, 2, false)
	w.notify(1, 1) // arrives while bucket 1 is looked at
	w.settle(l, 0, listEmpty, nil)
	assert.Equal(t, []int{1}, w.candidates(0, false, pop), "a notification during the look keeps the bucket")
	assert.Equal(t, 1, w.take(1, 5, false).n)

	w.notify(3, 2)
	l = w.take(3, 2, false)
	w.settle(l, 0, 0, errors.New("down"))
	assert.Equal(t, 2, w.take(3, 5, false).n, "a failed look gives its credit back")
	w.notify(0, 4)
	l = w.take(0, 4, false)
	w.settle(l, 1, onlyStale, nil)
	assert.Equal(t, 3, w.take(0, 5, false).n, "so does a look that met only stale IDs, for what it did not get")

	w.pollDue(0)
	w.candidates(0, false, pop)
	w.notify(3, 1)
	assert.Equal(t, []int{3, 0, 1, 2}, w.candidates(0, false, pop), "the bucket a waiter was woken for comes first")
	assert.Empty(t, pop.wake, "looking takes the wake-up")

	w.notify(99, 1) // from a queue with more buckets: ignored
	w.notify(2, math.MaxInt32)
	assert.Equal(t, 5, w.take(2, 5, false).n, "a count too large to keep is unknown")
	w.leave(pop)
	assert.Empty(t, w.waiters)
}

func TestTopicWatchWakesOneWaiterPerJob(t *testing.T) {
	w := newTopicWatch(2)
	pops := make([]*waiter, 5)
	for i := range pops {
		pops[i] = newWaiter()
		w.candidates(0, false, pops[i])
	}
	w.notify(1, 2)
	woken := func() (n int) {
		for _, p := range pops {
			n += len(p.wake)
		}
		return n
	}
	assert.Equal(t, 2, woken(), "two jobs wake two waiters")
	assert.Len(t, pops[0].wake, 1, "oldest first")
	assert.Len(t, pops[1].wake, 1)

	// A woken Pop that returns without looking passes its wake-up on.
	w.leave(pops[0])
	assert.Equal(t, 2, woken())
	assert.Len(t, pops[2].wake, 1)

	w.pollDue(0)
	assert.Equal(t, 4, woken(), "a recheck wakes every waiter")
	assert.Empty(t, w.waiters)
}

// Sixteen busy consumers of one process, with jobs becoming ready one at a
// time, look at a bucket's list for no more jobs than they were told of: n
// jobs cost about n reserve calls, not one per consumer that comes back to
// Pop while the bucket is "maybe not empty".
func TestBusyConsumersLookOncePerReadyJob(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		const jobs, consumers, buckets = 600, 16, 8
		reserves := &scriptCounter{script: scriptReserve}
		be.client.AddHook(reserves)
		name := uniqueName(t)
		consumer := newQueue(t, be.client, WithName(name), WithBuckets(buckets), WithSafetyPoll(time.Hour))
		producer := newQueue(t, be.client, WithName(name), WithBuckets(buckets))

		var got atomic.Int64
		var wg sync.WaitGroup
		for range consumers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for got.Load() < jobs {
					job, err := consumer.Pop(ctx, "t", 100*time.Millisecond)
					if errors.Is(err, ErrNoJob) {
						continue
					}
					if !assert.NoError(t, err) {
						return
					}
					assert.NoError(t, consumer.Finish(ctx, job.ID))
					got.Add(1)
				}
			}()
		}
		subscribed(t, consumer, "t")
		for range jobs {
			pushed(t, producer, &Job{Topic: "t"})
		}
		wg.Wait()
		require.EqualValues(t, jobs, got.Load())
		// Looks that find out what a bucket holds, at first and after a
		// subscription's confirmation, come on top: at most one per
		// consumer and bucket each time.
		assert.LessOrEqual(t, reserves.n.Load(), int64(jobs+2*consumers*buckets),
			"reserve calls for %d jobs", jobs)
	})
}

// A job whose notification was lost is found by the safety poll, also by a
// process that only runs Consume (whose Pops never outlast a poll) and
// whose counts said the bucket was empty.
func TestConsumeFindsAJobWhoseNotificationWasLost(t *testing.T) {
	c := miniredisClient(t)
	name := uniqueName(t)
	q := newQueue(t, c, WithName(name), WithSafetyPoll(100*time.Millisecond))
	producer := newQueue(t, c, WithName(name))
	ctx, cancel := context.WithCancel(context.Background())
	n, err := q.notifier(ctx)
	require.NoError(t, err)
	_, err = n.watch("t")
	require.NoError(t, err)
	subscribed(t, q, "t")
	got := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- q.Consume(ctx, "t", func(_ context.Context, job *Job) error {
			got <- job.ID
			return nil
		}, ConsumeOptions{})
	}()
	defer func() {
		cancel()
		assert.NoError(t, <-done)
	}()
	w := n.topicWatch("t")
	require.Eventually(t, func() bool { // Consume looked, found nothing, and waits
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.waiters) == 1 && !slices.ContainsFunc(w.ready, func(n int) bool { return n != 0 })
	}, 30*time.Second, time.Millisecond)

	// The job's message never reaches this process's consumers.
	n.mu.Lock()
	delete(n.routes, q.keys.bucket(0).readyChannel("t"))
	n.mu.Unlock()
	id := pushed(t, producer, &Job{Topic: "t"})

	select {
	case got := <-got:
		assert.Equal(t, id, got)
	case <-time.After(30 * time.Second):
		t.Fatal("the job was not found by the safety poll")
	}
}
