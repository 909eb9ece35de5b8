package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// binPath is the dqctl binary the tests run, built once by TestMain.
var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dqctl-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "dqctl")
	if out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build dqctl: %v\n%s", err, out)
		os.Exit(1)
	}
	code := redistest.Run(m)
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// result is what one run of the binary did.
type result struct {
	stdout, stderr string
	code           int
}

// ctl runs dqctl with args, stdin, and extra environment variables, and
// returns what it printed and its exit code. Its stdin is never a
// terminal: a pipe, empty unless stdin says otherwise.
func ctl(t *testing.T, env []string, stdin string, args ...string) result {
	t.Helper()
	cmd := exec.Command(binPath, args...)
	cmd.Env = append(cleanEnv(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("run dqctl %q: %v", args, err)
	}
	return result{out.String(), errOut.String(), cmd.ProcessState.ExitCode()}
}

// cleanEnv is the environment without the variables dqctl reads, so that
// only what a test sets reaches it.
func cleanEnv() []string {
	return append(os.Environ(), "DQ_ADDR=", "DQ_QUEUE=", "DQ_REDIS_USER=", "DQ_REDIS_PASSWORD=")
}

// fixture is a queue of its own on a real Redis, with a job in every
// state, and the flags that reach it.
type fixture struct {
	client redis.UniversalClient
	q      *delayqueue.DelayQueue
	name   string
	flags  []string // connection flags, --queue included
	// IDs of the jobs pushed: delayed, ready, reserved and dead, all of
	// topic "orders" but dead, of topic "mail"; one ready job of the
	// unicode topic "émoji.☃"; and "paused" is a paused topic without jobs.
	delayed, ready, reserved, dead, unicode string
}

var nameSeq atomic.Int64

// newFixture seeds a queue through the library, as workers would leave it.
func newFixture(t *testing.T, client redis.UniversalClient, flags ...string) *fixture {
	t.Helper()
	ctx := context.Background()
	f := &fixture{client: client, name: fmt.Sprintf("dqctl-%d", nameSeq.Add(1))}
	f.flags = append(flags, "--queue", f.name)
	q, err := delayqueue.New(client, delayqueue.WithName(f.name))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, q.Close(context.Background())) })
	f.q = q
	push := func(j *delayqueue.Job) string {
		id, err := q.Push(ctx, j)
		require.NoError(t, err)
		return id
	}
	pop := func(topic string) *delayqueue.Job {
		j, err := q.Pop(ctx, topic, time.Second)
		require.NoError(t, err)
		return j
	}
	f.reserved = push(&delayqueue.Job{Topic: "orders", Body: []byte("being done"), TTR: time.Hour})
	require.Equal(t, f.reserved, pop("orders").ID)
	f.dead = push(&delayqueue.Job{Topic: "mail", Body: []byte{0xff, 0x00, 0x01}, MaxAttempts: 1})
	require.NoError(t, q.Retry(ctx, pop("mail"), errors.New("smtp: 550\nno such user")))
	f.delayed = push(&delayqueue.Job{Topic: "orders", Body: []byte("later"), Delay: time.Hour,
		Headers: map[string]string{"trace": "abc"}})
	f.ready = push(&delayqueue.Job{Topic: "orders", Body: []byte("now\tplease")})
	f.unicode = push(&delayqueue.Job{Topic: "émoji.☃", Body: []byte("snow")})
	require.NoError(t, q.Pause(ctx, "paused"))
	return f
}

// run runs dqctl on the fixture's queue.
func (f *fixture) run(t *testing.T, args ...string) result {
	t.Helper()
	return ctl(t, nil, "", append(append([]string{}, f.flags...), args...)...)
}

// ok runs dqctl, requires exit code 0 and nothing on stderr, and returns
// stdout.
func (f *fixture) ok(t *testing.T, args ...string) string {
	t.Helper()
	r := f.run(t, args...)
	require.Equal(t, 0, r.code, "dqctl %q: stderr %s", args, r.stderr)
	return r.stdout
}

// json runs dqctl with --json and decodes its stdout into v.
func (f *fixture) json(t *testing.T, v any, args ...string) {
	t.Helper()
	out := f.ok(t, append(args, "--json")...)
	require.NoError(t, json.Unmarshal([]byte(out), v), "stdout: %s", out)
}

// noLeases requires that no bucket lease of the queue exists: dqctl never
// starts the queue.
func (f *fixture) noLeases(t *testing.T) {
	t.Helper()
	pattern := "dq:{" + f.name + ":*}:lock"
	var mu sync.Mutex // ForEachMaster runs in parallel
	var found []string
	collect := func(ctx context.Context, c redis.Cmdable) error {
		keys, err := c.Keys(ctx, pattern).Result()
		mu.Lock()
		defer mu.Unlock()
		found = append(found, keys...)
		return err
	}
	ctx := context.Background()
	if cc, ok := f.client.(*redis.ClusterClient); ok {
		require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return collect(ctx, c) }))
	} else {
		require.NoError(t, collect(ctx, f.client))
	}
	require.Empty(t, found, "bucket leases")
}

// serverFixture is a fixture on the shared redis-server; its flags begin
// with --addr.
func serverFixture(t *testing.T) *fixture {
	t.Helper()
	s := redistest.Shared(t)
	return newFixture(t, s.Client(t), "--addr", s.Addr)
}
