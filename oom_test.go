package delayqueue

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fillRedis pushes jobs of topic, due after delay, until Redis refuses
// one for want of memory, and returns the IDs of those it took. Every
// refusal must be ErrOutOfMemory.
func fillRedis(t *testing.T, q *DelayQueue, topic string, delay time.Duration) []string {
	t.Helper()
	ctx := context.Background()
	body := []byte(strings.Repeat("x", 1000))
	var ids []string
	for batch := 0; ; batch++ {
		jobs := make([]*Job, 200)
		for i := range jobs {
			jobs[i] = &Job{ID: fmt.Sprintf("%s-%d-%d", topic, batch, i), Topic: topic, Body: body, Delay: delay}
		}
		got, err := q.PushMany(ctx, jobs)
		if err != nil {
			require.ErrorIs(t, err, ErrOutOfMemory)
			var reply redis.Error
			assert.ErrorAs(t, err, &reply, "Redis's own error comes along")
			// PushMany pushes all or, bucket by bucket, some: ask the
			// queue which of this batch are in.
			for _, job := range jobs {
				if _, err := q.Get(ctx, job.ID); err == nil {
					ids = append(ids, job.ID)
				} else {
					require.ErrorIs(t, err, ErrNotFound)
				}
			}
			// Redis counted the batch's own request (about 200 KB of
			// query buffer) in its memory when it refused it: once read,
			// that is free again, and a single job may fit. Jobs one at a
			// time until one is refused: Redis is at maxmemory for a call
			// of that size.
			for i := 0; ; i++ {
				job := &Job{ID: fmt.Sprintf("%s-top-%d", topic, i), Topic: topic, Body: body, Delay: delay}
				if _, err := q.Push(ctx, job); err != nil {
					require.ErrorIs(t, err, ErrOutOfMemory)
					holdFull(t, q.client)
					return ids
				}
				ids = append(ids, job.ID)
				require.Less(t, i, 10_000, "Redis never filled up")
			}
		}
		for _, r := range got {
			ids = append(ids, r.ID)
		}
		require.Less(t, batch, 10_000, "Redis never filled up")
	}
}

// holdFull keeps a server that refused a write full: its limit goes half
// a megabyte below what it uses, so that memory Redis frees by itself (a
// client's query buffer it shrinks once the client is idle) makes no room
// for a write.
func holdFull(t *testing.T, c redis.UniversalClient) {
	t.Helper()
	used := usedMemory(t, c)
	require.NoError(t, c.ConfigSet(context.Background(), "maxmemory", strconv.FormatInt(used-512<<10, 10)).Err())
}

// startFull starts a redis-server that refuses writes past 20 MB.
func startFull(t *testing.T) *redis.Client {
	return redistest.Start(t, "--maxmemory", "20mb", "--maxmemory-policy", "noeviction").Client(t)
}

func usedMemory(t *testing.T, c redis.UniversalClient) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "memory").Result()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("no used_memory in INFO")
	return 0
}

// A queue that filled Redis while no process had started it drains by
// itself once workers start: opening it, moving its due jobs and taking
// them work at maxmemory, and finishing them frees the memory; pushes are
// refused meanwhile, and writing nothing.
func TestAFullRedisDrainsOnceWorkersStart(t *testing.T) {
	ctx := context.Background()
	c := startFull(t)
	name := uniqueName(t)
	producer := newQueue(t, c, WithName(name), WithBuckets(2))
	ids := fillRedis(t, producer, "t", 20*time.Millisecond)
	require.NotEmpty(t, ids)
	ov, err := producer.Overview(ctx)
	require.NoError(t, err, "reads work at maxmemory")
	assert.Equal(t, len(ids), ov.Jobs, "every acknowledged push is in, and nothing else")
	_, err = producer.Push(ctx, &Job{ID: "one-more", Topic: "t", Body: make([]byte, 1000)})
	assert.ErrorIs(t, err, ErrOutOfMemory)
	_, err = producer.Get(ctx, "one-more")
	assert.ErrorIs(t, err, ErrNotFound, "a refused push writes nothing")
	job, err := producer.Get(ctx, ids[0])
	require.NoError(t, err, "Get works at maxmemory")
	assert.Equal(t, "t", job.Topic)

	worker := newQueue(t, c, WithName(name)) // New opens the queue at maxmemory
	startQueue(t, worker)
	var done atomic.Int64
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	consumed := make(chan error, 1)
	go func() {
		consumed <- worker.Consume(cctx, "t", func(context.Context, *Job) error {
			done.Add(1)
			return nil
		}, ConsumeOptions{Concurrency: 16})
	}()
	require.Eventually(t, func() bool { return done.Load() == int64(len(ids)) }, 60*time.Second, 10*time.Millisecond,
		"every job is delivered and finished")
	stop()
	require.NoError(t, <-consumed)
	require.Eventually(t, func() bool {
		ov, err := producer.Overview(ctx)
		return err == nil && ov.Jobs == 0
	}, 10*time.Second, 10*time.Millisecond)
	pushed(t, producer, &Job{Topic: "t", Body: make([]byte, 1000)}) // room again
}

// Every script that may grow memory is refused before it writes: at
// maxmemory, thousands of upserts of new jobs (and of jobs that exist)
// change nothing.
func TestUpsertNeverPassesTheLimit(t *testing.T) {
	ctx := context.Background()
	c := startFull(t)
	q := newQueue(t, c, WithBuckets(2))
	ids := fillRedis(t, q, "t", time.Hour)
	before := usedMemory(t, c)
	for i := range 2000 {
		id := fmt.Sprintf("new-%d", i)
		if i%2 == 1 {
			id = ids[i%len(ids)]
		}
		_, err := q.Upsert(ctx, &Job{ID: id, Topic: "u", Body: make([]byte, 1000), Delay: time.Hour})
		require.ErrorIs(t, err, ErrOutOfMemory, "upsert %d", i)
	}
	for _, f := range []func() error{
		func() error { return q.RescheduleIn(ctx, ids[0], time.Minute) },
		func() error { _, err := q.Push(ctx, &Job{Topic: "t"}); return err },
		func() error { return q.Pause(ctx, "t") },
	} {
		assert.ErrorIs(t, f(), ErrOutOfMemory)
	}
	assert.Less(t, usedMemory(t, c)-before, int64(256<<10), "memory stayed where it was")
	ov, err := q.Overview(ctx)
	require.NoError(t, err)
	assert.Equal(t, len(ids), ov.Jobs)
	assert.Equal(t, len(ids), ov.Topics["t"].Delayed)
	page, err := q.List(ctx, "t", StateDelayed, ListOptions{Limit: 10})
	require.NoError(t, err, "listing works at maxmemory")
	assert.Len(t, page.Jobs, 10)
	require.NoError(t, q.Remove(ctx, ids[0]), "removing frees memory, and works")
}
