package delayqueue

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/dqueue/delayqueue/internal/syncbuf"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode))
	}
	os.Exit(redistest.Run(m))
}

// backend is one Redis the behaviour tests run against.
type backend struct {
	client redis.UniversalClient
	mini   *miniredis.Miniredis // nil on a real redis-server
}

// forEachBackend runs f against miniredis, a real redis-server and a real
// 3-master Redis Cluster.
func forEachBackend(t *testing.T, f func(t *testing.T, be backend)) {
	t.Run("miniredis", func(t *testing.T) {
		m := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		f(t, backend{client: c, mini: m})
	})
	t.Run("redis", func(t *testing.T) {
		f(t, backend{client: redistest.Shared(t).Client(t)})
	})
	t.Run("cluster", func(t *testing.T) {
		f(t, backend{client: redistest.ClusterClient(t, redistest.SharedCluster(t))})
	})
}

var nameSeq atomic.Int64
var nameChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// uniqueName gives each test its own queue on a shared Redis.
func uniqueName(t testing.TB) string {
	n := nameChars.ReplaceAllString(t.Name(), "_")
	if len(n) > 40 {
		n = n[len(n)-40:]
	}
	return fmt.Sprintf("%s.%d", n, nameSeq.Add(1))
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// newQueue opens a queue with a name of its own (unless opts name one) and
// closes it when the test ends.
func newQueue(t testing.TB, c redis.UniversalClient, opts ...Option) *DelayQueue {
	t.Helper()
	opts = append([]Option{WithName(uniqueName(t)), WithLogger(discard)}, opts...)
	q, err := New(c, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { closeQueue(t, q) })
	return q
}

func closeQueue(t testing.TB, q *DelayQueue) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := q.Close(ctx)
	if err != nil {
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
	}
	require.NoError(t, err)
}

func startQueue(t testing.TB, q *DelayQueue) {
	t.Helper()
	require.NoError(t, q.Start(context.Background()))
}

// capture is a slog handler that keeps records for assertions.
type capture struct{ syncbuf.Buffer }

func (c *capture) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(&c.Buffer, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// serverMs reads the Redis server's clock in milliseconds.
func serverMs(t testing.TB, c redis.UniversalClient) int64 {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	require.NoError(t, err)
	return now.UnixMilli()
}

// keysOf lists every key in Redis (on every master of a cluster), sorted.
func keysOf(t testing.TB, c redis.UniversalClient) []string {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	var keys []string
	collect := func(ctx context.Context, c redis.Cmdable) error {
		k, err := c.Keys(ctx, "*").Result()
		mu.Lock()
		defer mu.Unlock()
		keys = append(keys, k...)
		return err
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return collect(ctx, m) }))
	} else {
		require.NoError(t, collect(ctx, c))
	}
	slices.Sort(keys)
	return keys
}

// keysOfQueues is keysOf for the keys of the named queues alone: another
// test's keys may come and go meanwhile (a key of theirs expires).
func keysOfQueues(t testing.TB, c redis.UniversalClient, names ...string) []string {
	t.Helper()
	var keys []string
	for _, k := range keysOf(t, c) {
		for _, name := range names {
			if strings.Contains(k, "{"+name+":") || strings.Contains(k, "{"+name+"}") {
				keys = append(keys, k)
				break
			}
		}
	}
	return keys
}

// pushed pushes a job and fails the test on error.
func pushed(t testing.TB, q *DelayQueue, job *Job) string {
	t.Helper()
	id, err := q.Push(context.Background(), job)
	require.NoError(t, err)
	return id
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// miniredisClient returns a client of a fresh miniredis.
func miniredisClient(t *testing.T) *redis.Client {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// verifyNoLeaks fails the test when goroutines started since the call
// outlive it. The client's pooled connections stay open, and so do
// miniredis's goroutines serving them and the per-node goroutines a cluster
// client starts as it meets nodes; every goroutine of the queue must end.
func verifyNoLeaks(t *testing.T) func() {
	opts := []goleak.Option{goleak.IgnoreCurrent(),
		goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer"),
		goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer.func2"),
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/maintnotifications.(*CircuitBreakerManager).cleanupLoop")}
	return func() { goleak.VerifyNone(t, opts...) }
}

// keyStats are a queue's figures read from its keys' sizes, summed over
// its buckets: what a test checks below the counts the scripts keep.
type keyStats struct {
	Jobs      int // the pool: every job, of every topic and state
	Scheduled int // the bucket zsets: delayed and reserved jobs of every topic
	Ready     int // the topic's ready lists, with the IDs left by jobs no longer ready
	Dead      int // the topic's dead letters
}

// readKeyStats reads keyStats for topic in one pipeline.
func readKeyStats(ctx context.Context, q *DelayQueue, topic string) (keyStats, error) {
	pipe := q.client.Pipeline()
	cmds := make([][4]*redis.IntCmd, q.opts.buckets)
	for b := range cmds {
		bk := q.keys.bucket(b)
		cmds[b] = [4]*redis.IntCmd{
			pipe.HLen(ctx, bk.pool), pipe.ZCard(ctx, bk.zset),
			pipe.LLen(ctx, bk.ready(topic)), pipe.ZCard(ctx, bk.dead(topic)),
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return keyStats{}, err
	}
	var s keyStats
	for _, c := range cmds {
		s.Jobs += int(c[0].Val())
		s.Scheduled += int(c[1].Val())
		s.Ready += int(c[2].Val())
		s.Dead += int(c[3].Val())
	}
	return s, nil
}

// listJobs lists up to limit jobs of topic in state, List's pages one after
// another.
func listJobs(ctx context.Context, q *DelayQueue, topic string, state State, limit int) ([]*Job, error) {
	var jobs []*Job
	var opts ListOptions
	for len(jobs) < limit {
		opts.Limit = min(limit-len(jobs), maxListLimit)
		page, err := q.List(ctx, topic, state, opts)
		if err != nil {
			return nil, err
		}
		jobs = append(jobs, page.Jobs...)
		if page.Next == "" {
			break
		}
		opts.Cursor = page.Next
	}
	return jobs, nil
}

// pushWithResult pushes one job with PushMany, which says whether it
// existed.
func pushWithResult(ctx context.Context, q *DelayQueue, job *Job) (PushResult, error) {
	res, err := q.PushMany(ctx, []*Job{job})
	if err != nil {
		return PushResult{}, err
	}
	return res[0], nil
}

// runsScript reports whether cmd runs script s: by SHA or by its code, in
// either form, or as a function.
func runsScript(cmd redis.Cmder, s *luaScript) bool {
	args := cmd.Args()
	if len(args) < 2 {
		return false
	}
	name := args[1]
	if code, ok := name.(string); ok && args[0] == "eval" {
		sum := sha1.Sum([]byte(code))
		name = hex.EncodeToString(sum[:])
	}
	return name == s.flagged.Hash() || name == s.plain.Hash() || name == s.fn()
}

// scriptCalls is how many script calls commandstats counts (commandCalls):
// by SHA and as functions.
func scriptCalls(calls map[string]int64) int64 {
	return calls["evalsha"] + calls["fcall"]
}

// loadedScript loads script s on q's server, in the form q runs it, and
// returns what names it in q's calls: its function's name, or its SHA.
func loadedScript(t *testing.T, q *DelayQueue, s *luaScript) string {
	t.Helper()
	ctx := context.Background()
	if q.usesFunctions() {
		require.NoError(t, q.loadLibrary(ctx))
		return s.fn()
	}
	require.NoError(t, s.on(q.plain).Load(ctx, q.client).Err())
	return s.on(q.plain).Hash()
}

// forgetScripts has the server, or every master, forget the scripts and
// the functions it was sent, as a restart without persistence does.
func forgetScripts(t *testing.T, c redis.UniversalClient) {
	t.Helper()
	ctx := context.Background()
	forget := func(ctx context.Context, c *redis.Client) error {
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			return err
		}
		if err := c.FunctionFlush(ctx).Err(); err != nil && !strings.Contains(strings.ToLower(err.Error()), "unknown command") {
			return err // miniredis has no functions
		}
		return nil
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		require.NoError(t, cc.ForEachMaster(ctx, forget))
		return
	}
	client, ok := c.(*redis.Client)
	require.True(t, ok, "a client of type %T", c)
	require.NoError(t, forget(ctx, client))
}

// popped is what a pop in the background got.
type popped struct {
	got []*Job
	err error
}

func (p popped) jobs(t *testing.T) []*Job {
	t.Helper()
	require.NoError(t, p.err)
	return p.got
}

// popLater pops up to n jobs of topic t in the background; the test body
// asserts on what arrives, so a failure shows where it happened.
func popLater(q *DelayQueue, n int) <-chan popped {
	done := make(chan popped, 1)
	go func() {
		jobs, err := q.pop(context.Background(), "t", n, 0)
		done <- popped{jobs, err}
	}()
	return done
}

// popOneLater calls q.Pop of topic with timeout in the background; the
// test body asserts on what arrives (popped.job).
func popOneLater(q *DelayQueue, topic string, timeout time.Duration) <-chan popped {
	done := make(chan popped, 1)
	go func() {
		job, err := q.Pop(context.Background(), topic, timeout)
		done <- popped{[]*Job{job}, err}
	}()
	return done
}

// job is the one job a popOneLater got; the test fails when its Pop did.
func (p popped) job(t *testing.T) *Job {
	t.Helper()
	require.NoError(t, p.err)
	require.Len(t, p.got, 1)
	return p.got[0]
}
