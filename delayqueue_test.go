package delayqueue

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewChecksTheStoredBucketCount(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		name := uniqueName(t)
		q := newQueue(t, be.client, WithName(name), WithBuckets(4))
		meta := be.client.HGetAll(context.Background(), q.keys.meta()).Val()
		_, err := New(be.client, WithName(name), WithBuckets(8))
		assert.ErrorIs(t, err, ErrBucketMismatch)
		assert.Equal(t, meta, be.client.HGetAll(context.Background(), q.keys.meta()).Val(), "a refused New writes nothing")
		newQueue(t, be.client, WithName(name), WithBuckets(4))
	})
}

// Without WithBuckets, a queue keeps the bucket count it was created with,
// and a new one gets one bucket on a single server and eight on a Cluster.
func TestNewTakesTheStoredBucketCountByDefault(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		fresh := newQueue(t, be.client)
		want := 1
		if _, cluster := be.client.(*redis.ClusterClient); cluster {
			want = 8
		}
		assert.Equal(t, want, fresh.opts.buckets, "a new queue")

		name := uniqueName(t)
		created := newQueue(t, be.client, WithName(name), WithBuckets(5))
		opened := newQueue(t, be.client, WithName(name))
		assert.Equal(t, 5, opened.opts.buckets, "an existing queue keeps its count")
		id := pushed(t, created, &Job{Topic: "t"})
		job, err := opened.Pop(ctx, "t", 0)
		require.NoError(t, err)
		assert.Equal(t, id, job.ID, "the two instances agree on the job's bucket")

		_, err = New(be.client, WithName(name), WithBuckets(0))
		assert.ErrorIs(t, err, ErrInvalidOption, "zero buckets asked for")
	})
}

func TestCloseEndsTheNotifierEvenWhenAHandlerIsStuck(t *testing.T) {
	c := miniredisClient(t)
	defer verifyNoLeaks(t)()
	q, err := New(c, WithName(uniqueName(t)), WithLogger(discard))
	require.NoError(t, err)
	_, err = q.Pop(context.Background(), "t", 0) // subscribes
	require.ErrorIs(t, err, ErrNoJob)
	q.mu.Lock()
	notes, waits := q.notes, q.waits
	q.mu.Unlock()
	expired, cancel := context.WithCancel(context.Background())
	cancel()
	stuck := make(chan struct{}) // a handler that never returns
	err = q.stop(expired, func() {}, stuck, nil, notes, waits)
	assert.ErrorIs(t, err, context.Canceled)
	notes.mu.Lock()
	assert.True(t, notes.closed)
	notes.mu.Unlock()
}

func TestReserveCallsOfTwoInstancesNeverShareAName(t *testing.T) {
	c := miniredisClient(t)
	name := uniqueName(t)
	a := newQueue(t, c, WithName(name))
	require.NoError(t, c.HIncrBy(context.Background(), a.keys.meta(), "nodes", -1).Err())
	b := newQueue(t, c, WithName(name)) // the same instance number, after the counter went back
	require.Equal(t, *a.ids.prefix.Load(), *b.ids.prefix.Load())
	assert.NotEqual(t, a.callName(), b.callName())
}

func TestNewRefusesJobsOfAnotherEncoding(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		name := uniqueName(t)
		q := newQueue(t, be.client, WithName(name))
		// A queue made before the encoding was recorded holds text-encoded
		// jobs that this version would misread.
		require.NoError(t, be.client.HDel(ctx, q.keys.meta(), "format").Err())
		_, err := New(be.client, WithName(name))
		assert.ErrorIs(t, err, ErrFormatMismatch)
		require.NoError(t, be.client.HSet(ctx, q.keys.meta(), "format", 1).Err())
		_, err = New(be.client, WithName(name))
		assert.ErrorIs(t, err, ErrFormatMismatch, "format 1 had no dedup windows")
		require.NoError(t, be.client.HSet(ctx, q.keys.meta(), "format", 2).Err())
		_, err = New(be.client, WithName(name))
		assert.ErrorIs(t, err, ErrFormatMismatch, "format 2 kept no counts")
		require.NoError(t, be.client.HSet(ctx, q.keys.meta(), "format", queueFormat).Err())
		newQueue(t, be.client, WithName(name))
	})
}

func TestNewReturnsRedisErrors(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer c.Close()
	_, err := New(c)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "delayqueue: open queue")
}

func TestQueuesGetDifferentIDPrefixes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		name := uniqueName(t)
		prefixes := map[string]bool{}
		for range 3 {
			q := newQueue(t, be.client, WithName(name))
			id := pushed(t, q, &Job{Topic: "t", Delay: time.Hour})
			assert.True(t, strings.HasPrefix(id, *q.ids.prefix.Load()), id)
			prefixes[*q.ids.prefix.Load()] = true
		}
		assert.Len(t, prefixes, 3)
	})
}

func TestStartAndCloseLifecycle(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		// The client's pooled connections stay open, and so do miniredis's
		// goroutines serving them; every goroutine of the queue must end.
		defer verifyNoLeaks(t)()
		ctx := context.Background()
		q, err := New(be.client, WithName(uniqueName(t)), WithLogger(discard))
		require.NoError(t, err)
		require.NoError(t, q.Start(ctx))
		assert.ErrorIs(t, q.Start(ctx), ErrStarted)
		_, err = q.Pop(ctx, "t", 0)
		require.ErrorIs(t, err, ErrNoJob)

		require.NoError(t, q.Close(ctx))
		require.NoError(t, q.Close(ctx), "a second Close is fine")
		assert.ErrorIs(t, q.Start(ctx), ErrClosed)
		_, err = q.Push(ctx, &Job{Topic: "t"})
		assert.ErrorIs(t, err, ErrClosed)
		_, err = q.Pop(ctx, "t", 0)
		assert.ErrorIs(t, err, ErrClosed)
		assert.ErrorIs(t, q.Finish(ctx, "x"), ErrClosed)
		assert.ErrorIs(t, q.Remove(ctx, "x"), ErrClosed)
		_, err = q.Get(ctx, "x")
		assert.ErrorIs(t, err, ErrClosed)
		_, err = q.StaleFunctions(ctx)
		assert.ErrorIs(t, err, ErrClosed)
		_, err = q.PruneFunctions(ctx)
		assert.ErrorIs(t, err, ErrClosed)
		for b := range q.opts.buckets {
			assert.Zero(t, be.client.Exists(ctx, q.keys.bucket(b).lock).Val(), "Close releases the leases")
		}
	})
}

func TestCloseReturnsWhenItsContextEnds(t *testing.T) {
	m := miniredisClient(t)
	q := newQueue(t, m)
	startQueue(t, q)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := q.Close(ctx)
	if err != nil {
		assert.ErrorIs(t, err, context.Canceled)
	}
}

func TestStartWarnsWhenRedisMayEvictJobs(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
	logs := &capture{}
	q := newQueue(t, s.Client(t), WithLogger(logs.logger()))
	startQueue(t, q)
	assert.Contains(t, logs.String(), "maxmemory-policy=allkeys-lru")

	quiet := &capture{}
	q = newQueue(t, redistest.Shared(t).Client(t), WithLogger(quiet.logger()))
	require.NoError(t, q.Start(ctx))
	assert.NotContains(t, quiet.String(), "evict", "noeviction is the default and gets no warning")
}

// queueKeys lists the keys of one queue, on every master.
func queueKeys(t *testing.T, c redis.UniversalClient, name string) []string {
	t.Helper()
	var keys []string
	for _, k := range keysOf(t, c) {
		if strings.Contains(k, "{"+name+":") || strings.Contains(k, "{"+name+"}") {
			keys = append(keys, k)
		}
	}
	return keys
}

func TestAFullLifeCycleLeavesOnlyTheQueuesMetadata(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		name := uniqueName(t)
		q := newQueue(t, be.client, WithName(name), WithBackoff(BackoffSchedule(0)), WithMaxAttempts(2),
			WithSafetyPoll(200*time.Millisecond))
		startQueue(t, q)
		// Every path a job can take: finished at once or later, retried,
		// dead then requeued, dead then removed, removed while delayed or
		// ready, finished with a dedup window.
		var want []string
		for i := range 20 {
			want = append(want, pushed(t, q, &Job{Topic: "t", Delay: time.Duration(i%2) * 50 * time.Millisecond}))
		}
		requeued := pushed(t, q, &Job{Topic: "t", Body: []byte("fail")})
		buried := pushed(t, q, &Job{Topic: "t", Body: []byte("fail")})
		want = append(want, requeued, pushed(t, q, &Job{Topic: "t", Body: []byte("retry")}),
			pushed(t, q, &Job{ID: "windowed", Topic: "t", DedupWindow: 100 * time.Millisecond}))
		require.NoError(t, q.Remove(ctx, pushed(t, q, &Job{Topic: "t", Delay: time.Hour})))
		require.NoError(t, q.Remove(ctx, pushed(t, q, &Job{Topic: "gone"}))) // its ID stays in a ready list

		var mu sync.Mutex
		done := map[string]bool{}
		failed := map[string]int{}
		h := func(ctx context.Context, job *Job) error {
			mu.Lock()
			defer mu.Unlock()
			switch string(job.Body) {
			case "fail":
				if failed[job.ID]++; failed[job.ID] <= 2 {
					return errors.New("failing")
				}
			case "retry":
				if failed[job.ID]++; failed[job.ID] == 1 {
					return errors.New("once")
				}
			}
			done[job.ID] = true
			return nil
		}
		cctx, stop := context.WithCancel(ctx)
		errc := make(chan error, 2)
		go func() { errc <- q.Consume(cctx, "t", h, ConsumeOptions{Concurrency: 4}) }()
		go func() {
			errc <- q.Consume(cctx, "gone", func(context.Context, *Job) error { return errors.New("never") }, ConsumeOptions{})
		}()
		require.Eventually(t, func() bool {
			dead, err := listJobs(ctx, q, "t", StateDead, 10)
			return err == nil && len(dead) == 2
		}, 30*time.Second, 5*time.Millisecond)
		require.NoError(t, q.RequeueDead(ctx, requeued))
		require.NoError(t, q.Remove(ctx, buried))
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, id := range want {
				if !done[id] {
					return false
				}
			}
			return true
		}, 30*time.Second, 5*time.Millisecond)
		require.Eventually(t, func() bool {
			st, err := readKeyStats(ctx, q, "t")
			return err == nil && st.Jobs == 0 && st.Ready == 0
		}, 30*time.Second, 5*time.Millisecond, "every job is finished")
		stop()
		require.NoError(t, <-errc)
		require.NoError(t, <-errc)
		// The tombstone's window ends, and the handler deletes it, and the
		// counts that fell to zero.
		require.Eventually(t, func() bool {
			return !slices.ContainsFunc(queueKeys(t, be.client, name), func(k string) bool {
				return strings.HasSuffix(k, ":dedup") || strings.HasSuffix(k, ":counts")
			})
		}, 30*time.Second, 10*time.Millisecond)
		closeQueue(t, q)

		keys := queueKeys(t, be.client, name)
		t.Logf("keys left: %v", keys)
		for _, k := range keys {
			// The watch record expires twice the lease after the last look
			// (schedule_tick.go), the history an hour after its last sample
			// (history.go), a look for a lost signal a second after it
			// (scripts/reserve.lua), which may be gone by now.
			if strings.HasSuffix(k, ":watched") || strings.Contains(k, ":hist:") {
				assert.Positive(t, be.client.PTTL(ctx, k).Val(), "%q expires", k)
				continue
			}
			if strings.Contains(k, ":lost:") {
				ttl, err := be.client.PTTL(ctx, k).Result()
				require.NoError(t, err)
				// PTTL says 0 in the key's last millisecond, -2 once gone.
				assert.True(t, ttl >= 0 || ttl == -2*time.Nanosecond, "%q expires (PTTL %v)", k, ttl)
				continue
			}
			isMeta := k == q.keys.meta()
			assert.True(t, isMeta || strings.HasSuffix(k, ":leases"), "%q is left behind", k)
		}
		assert.Contains(t, keys, q.keys.meta())
	})
}

// TestWithoutInstanceWritesNothing: a queue opened to look and operate
// neither creates the queue nor takes an instance number.
func TestWithoutInstanceWritesNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		name := uniqueName(t)
		_, err := New(be.client, WithName(name), WithoutInstance())
		require.ErrorIs(t, err, ErrNotFound)
		assert.Empty(t, queueKeys(t, be.client, name), "nothing created")

		q := newQueue(t, be.client, WithName(name))
		id := pushed(t, q, &Job{Topic: "t"})
		nodes := be.client.HGet(ctx, q.keys.meta(), "nodes").Val()
		look, err := New(be.client, WithName(name), WithoutInstance(), WithLogger(discard))
		require.NoError(t, err)
		t.Cleanup(func() { closeQueue(t, look) })
		assert.Equal(t, nodes, be.client.HGet(ctx, q.keys.meta(), "nodes").Val(), "no instance number taken")
		got, err := look.Get(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, "t", got.Topic)
		_, err = look.Push(ctx, &Job{Topic: "t"})
		assert.ErrorIs(t, err, ErrInvalidJob, "it generates no IDs")
		_, err = look.Push(ctx, &Job{ID: "mine", Topic: "t"})
		require.NoError(t, err)
		c, err := look.Counts(ctx, "t")
		require.NoError(t, err)
		assert.Equal(t, 2, c.Ready)
	})
}

// A nil context is a programmer's error, and panics; the queue stays
// usable: no lock is left held.
func TestANilContextPanicsAndLeavesNoLockHeld(t *testing.T) {
	q := newQueue(t, miniredisClient(t))
	//lint:ignore SA1012 the nil context is the test
	assert.Panics(t, func() { _ = q.Start(nil) }) //nolint:staticcheck
	//lint:ignore SA1012 the nil context is the test
	assert.Panics(t, func() { _ = q.Close(nil) }) //nolint:staticcheck
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, q.Start(ctx))
	require.NoError(t, q.Close(ctx))
}

// After Redis lost its data, the started processes put the queue's record
// back as they know it, so that a process that opens the queue later finds
// it as it was, not anew with other buckets.
func TestStartedProcessesPutTheQueueRecordBack(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	c := srv.Client(t)
	name := uniqueName(t)
	q := newQueue(t, c, WithName(name), WithBuckets(4), WithLease(300*time.Millisecond))
	startQueue(t, q)
	recordBack := func() bool {
		look, err := New(c, WithName(name), WithoutInstance(), WithLogger(discard))
		if err != nil {
			return false
		}
		defer closeQueue(t, look)
		return look.opts.buckets == 4 && look.ident == q.ident
	}
	require.True(t, recordBack())

	// Lost while the connections stay up: the lease holder finds its
	// lease gone.
	require.Eventually(t, func() bool { return leasesHeld(t, q) == 4 }, 10*time.Second, time.Millisecond)
	require.NoError(t, c.FlushAll(ctx).Err())
	require.Eventually(t, recordBack, 10*time.Second, 10*time.Millisecond)
	other := newQueue(t, c, WithName(name))
	assert.Equal(t, 4, other.opts.buckets)
	assert.Greater(t, other.instance, q.instance, "the instance counter did not go back")

	// Lost with a restart: the bucket handlers reach Redis again.
	require.NoError(t, srv.Restart())
	require.Eventually(t, recordBack, 10*time.Second, 10*time.Millisecond)
	id := pushed(t, other, &Job{Topic: "t"})
	job, err := q.Pop(ctx, "t", 0)
	require.NoError(t, err)
	assert.Equal(t, id, job.ID)
}

// leasesHeld counts the buckets of q whose lease has a holder.
func leasesHeld(t *testing.T, q *DelayQueue) int {
	n := 0
	for b := range q.opts.buckets {
		if q.client.Exists(context.Background(), q.keys.bucket(b).lock).Val() == 1 {
			n++
		}
	}
	return n
}
