package delayqueue

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pushCall is what a push middleware saw of one push call.
type pushCall struct {
	before, after []string // the jobs' IDs before and after next
	err           error
}

// pushRecorder is a push middleware that records each call and adds a
// header to each job.
type pushRecorder struct {
	mu    sync.Mutex
	calls []pushCall
}

func (r *pushRecorder) middleware(next PushFunc) PushFunc {
	return func(ctx context.Context, jobs []*Job) error {
		var c pushCall
		for _, job := range jobs {
			c.before = append(c.before, job.ID)
			job.Headers = map[string]string{"seen": job.ID}
		}
		c.err = next(ctx, jobs)
		for _, job := range jobs {
			c.after = append(c.after, job.ID)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.calls = append(r.calls, c)
		return c.err
	}
}

func (r *pushRecorder) all() []pushCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

func TestPushMiddlewareWrapsEveryPushAndSeesItsIDsAndError(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		rec := &pushRecorder{}
		q := newQueue(t, be.client, WithPushMiddleware(rec.middleware))

		job := &Job{Topic: "t"}
		id := pushed(t, q, job)
		_, err := q.Push(ctx, &Job{ID: "mine", Topic: "t"})
		require.NoError(t, err)
		jobs := []*Job{{Topic: "t"}, {ID: "many", Topic: "t"}}
		res, err := q.PushMany(ctx, jobs)
		require.NoError(t, err)
		ids := []string{res[0].ID, res[1].ID}
		_, err = q.PushMany(ctx, []*Job{{ID: "more", Topic: "t"}})
		require.NoError(t, err)
		_, err = q.Upsert(ctx, &Job{ID: "mine", Topic: "t", Delay: time.Hour})
		require.NoError(t, err)

		calls := rec.all()
		require.Len(t, calls, 5, "one call per push, whatever its number of jobs")
		assert.Equal(t, []string{id}, calls[0].before, "a generated ID is assigned before the middleware runs")
		assert.Equal(t, []string{"mine"}, calls[1].before)
		assert.Equal(t, ids, calls[2].before)
		assert.Equal(t, ids, calls[2].after)
		assert.Equal(t, []string{"more"}, calls[3].before)
		assert.Equal(t, []string{"mine"}, calls[4].before)
		for _, c := range calls {
			assert.NoError(t, c.err)
		}
		for _, id := range append(ids, id, "mine", "more") {
			got, err := q.Get(ctx, id)
			require.NoError(t, err)
			assert.Equal(t, map[string]string{"seen": id}, got.Headers, "what the middleware set is stored")
		}

		// The push's error reaches the middleware, which returns it.
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		_, err = q.Upsert(cancelled, &Job{ID: "held", Topic: "u"})
		require.ErrorIs(t, err, context.Canceled)
		calls = rec.all()
		assert.ErrorIs(t, calls[len(calls)-1].err, context.Canceled)
	})
}

func TestPushMiddlewareNeverSeesARefusedJob(t *testing.T) {
	ctx := context.Background()
	rec := &pushRecorder{}
	c := miniredisClient(t)
	q := newQueue(t, c, WithPushMiddleware(rec.middleware))
	job := &Job{Topic: "bad topic"}
	_, err := q.Push(ctx, job)
	assert.ErrorIs(t, err, ErrInvalidJob)
	_, err = q.PushMany(ctx, []*Job{{Topic: "t"}, {Topic: "t", Delay: -1}})
	assert.ErrorIs(t, err, ErrInvalidJob)
	assert.Empty(t, rec.all(), "refused before the middleware")
	assert.Empty(t, job.ID, "a refused push changes nothing")

	// A middleware that breaks a limit fails the push, which stores nothing.
	breaker := func(next PushFunc) PushFunc {
		return func(ctx context.Context, jobs []*Job) error {
			jobs[0].Headers = manyHeaders(maxHeaders + 1)
			return next(ctx, jobs)
		}
	}
	q = newQueue(t, c, WithPushMiddleware(breaker))
	before := keysOfQueues(t, c, q.opts.name)
	_, err = q.Push(ctx, &Job{Topic: "t"})
	assert.ErrorIs(t, err, ErrInvalidJob)
	assert.Equal(t, before, keysOfQueues(t, c, q.opts.name))
}

func TestPushMiddlewareRunsInTheOrderGiven(t *testing.T) {
	var order []string
	named := func(name string) PushMiddleware {
		return func(next PushFunc) PushFunc {
			return func(ctx context.Context, jobs []*Job) error {
				order = append(order, name)
				return next(ctx, jobs)
			}
		}
	}
	q := newQueue(t, miniredisClient(t), WithPushMiddleware(named("a"), named("b")), WithPushMiddleware(named("c")))
	pushed(t, q, &Job{Topic: "t"})
	assert.Equal(t, []string{"a", "b", "c"}, order)
}

func TestPushMiddlewareSeesTheNewIDOfATakenGeneratedID(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		name := uniqueName(t)
		rec := &pushRecorder{}
		// One bucket: the next queue makes older's IDs in older's order
		// (with more, each skips the counts outside its bucket of the
		// moment; see TestAGeneratedIDIsNeverAcknowledgedForAnotherJob).
		older := newQueue(t, be.client, WithName(name), WithBuckets(1))
		// The instance counter went back (see ids.go): the next queue
		// makes older's IDs.
		require.NoError(t, be.client.HIncrBy(ctx, older.keys.meta(), "nodes", -1).Err())
		q := newQueue(t, be.client, WithName(name), WithBuckets(1), WithPushMiddleware(rec.middleware))
		in := pushed(t, older, &Job{Topic: "t"})
		id := pushed(t, q, &Job{Topic: "t"})
		assert.NotEqual(t, in, id)
		calls := rec.all()
		require.Len(t, calls, 1)
		assert.Equal(t, []string{in}, calls[0].before, "the ID given before the push")
		assert.Equal(t, []string{id}, calls[0].after, "the ID it was stored under")
	})
}

func TestNilMiddlewareIsRefused(t *testing.T) {
	c := miniredisClient(t)
	_, err := New(c, WithPushMiddleware(nil))
	assert.ErrorIs(t, err, ErrInvalidOption)
	_, err = New(c, WithConsumeMiddleware(nil))
	assert.ErrorIs(t, err, ErrInvalidOption)
}

// TestTheRootPackageImportsNoIntegration keeps OpenTelemetry and
// Prometheus out of what a user of the root package compiles: they plug in
// through its hooks, from packages of their own.
func TestTheRootPackageImportsNoIntegration(t *testing.T) {
	gocmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the imports with")
	}
	// The core module alone (GOWORK=off): the integrations are modules of
	// their own, and the workspace's go.work.sum may be written by another
	// go command of the same run meanwhile.
	cmd := exec.Command(gocmd, "list", "-deps", ".")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, stderr.String())
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/redis/go-redis/v9")
	for _, pkg := range deps {
		assert.NotContains(t, pkg, "opentelemetry")
		assert.NotContains(t, pkg, "prometheus")
	}
}
