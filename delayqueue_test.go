package delayqueue

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewRejectsBadOptions(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		before := keysOf(t, be.client)
		for name, opt := range map[string]Option{
			"nil option":         nil,
			"empty name":         WithName(""),
			"name with brace":    WithName("a{b"),
			"name with colon":    WithName("a:b"),
			"zero buckets":       WithBuckets(0),
			"too many buckets":   WithBuckets(5000),
			"zero TTR":           WithDefaultTTR(0),
			"zero attempts":      WithMaxAttempts(0),
			"too many attempts":  WithMaxAttempts(65536),
			"TTR over 49 days":   WithDefaultTTR(maxTTR + time.Millisecond),
			"zero body":          WithMaxBodySize(0),
			"tiny lease":         WithLease(time.Millisecond),
			"zero batch":         WithBatchSize(0),
			"huge batch":         WithBatchSize(100000),
			"zero safety poll":   WithSafetyPoll(0),
			"nil logger":         WithLogger(nil),
			"negative dedup":     WithDedupWindow(-time.Second),
			"dedup over 49 days": WithDedupWindow(maxDedupWindow + time.Millisecond),
		} {
			q, err := New(be.client, opt)
			assert.ErrorIs(t, err, ErrInvalidOption, name)
			assert.Nil(t, q)
		}
		_, err := New(nil)
		assert.ErrorIs(t, err, ErrInvalidOption)
		assert.Equal(t, before, keysOf(t, be.client), "a refused New writes nothing")
	})
}

func TestNewChecksTheStoredBucketCount(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		name := uniqueName(t)
		newQueue(t, be.client, WithName(name), WithBuckets(4))
		_, err := New(be.client, WithName(name), WithBuckets(8))
		assert.ErrorIs(t, err, ErrBucketMismatch)
		newQueue(t, be.client, WithName(name), WithBuckets(4))
	})
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
		require.NoError(t, be.client.HSet(ctx, q.keys.meta(), "format", jobFormatVersion).Err())
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
