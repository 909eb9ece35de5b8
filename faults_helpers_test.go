package delayqueue

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// soak reports whether DQ_SOAK=1 asks for full-scale fault runs.
func soak() bool { return os.Getenv("DQ_SOAK") == "1" }

// scale picks a job count for the default run or the soak run.
func scale(quick, full int) int {
	if soak() {
		return full
	}
	return quick
}

func runHelper(mode string) int {
	c := redis.NewClient(&redis.Options{Addr: os.Getenv("DQ_ADDR")})
	lease, _ := time.ParseDuration(os.Getenv("DQ_LEASE"))
	if lease == 0 {
		lease = 30 * time.Second
	}
	opts := []Option{WithName(os.Getenv("DQ_NAME")), WithLease(lease), WithLogger(discard)}
	if poll, _ := time.ParseDuration(os.Getenv("DQ_POLL")); poll > 0 {
		opts = append(opts, WithSafetyPoll(poll))
	}
	ctx := context.Background()
	switch mode {
	case "push":
		return pushHelper(c, opts)
	case "consume":
		q, err := New(c, opts...)
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		return consumeHelper(q)
	case "finish-late":
		q, err := New(c, opts...)
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		return finishLateHelper(q)
	case "hold": // pop DQ_N jobs, say so, and hold them until killed
		q, err := New(c, opts...)
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		n, _ := strconv.Atoi(os.Getenv("DQ_N"))
		for i := 0; i < n; {
			if _, err := q.Pop(ctx, "t", time.Minute); err == nil {
				i++
			}
		}
		fmt.Println("held", n)
	case "limited": // consume "t", each handler counting those that run in every process, until killed
		q, err := New(c, opts...)
		if err == nil {
			err = q.Start(ctx)
		}
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		fmt.Println("started")
		_ = q.Consume(ctx, "t", limitedHandler(c, os.Getenv("DQ_NAME")), ConsumeOptions{Concurrency: 4})
	case "mover": // move jobs until killed
		q, err := New(c, opts...)
		if err == nil {
			err = q.Start(ctx)
		}
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		fmt.Println("started")
	case "churn": // open, move for a moment, close; again and again until killed
		fmt.Println("started")
		for {
			q, err := New(c, opts...)
			if err != nil {
				continue
			}
			if q.Start(ctx) == nil {
				time.Sleep(time.Duration(20+rand.IntN(200)) * time.Millisecond) // a process's lifetime
			}
			_ = q.Close(ctx)
		}
	default:
		fmt.Println("unknown helper", mode)
		return 2
	}
	select {} // until killed
}

// readLine reads a line from stdin, as a helper is told what to do, and
// reports whether it is want.
func readLine(want string) bool {
	in := bufio.NewScanner(os.Stdin)
	return in.Scan() && in.Text() == want
}

// startedQueue opens a started queue of its own on the shared
// redis-server, for a test whose other processes open it by its name.
func startedQueue(t *testing.T) (s *redistest.Server, name string, q *DelayQueue) {
	t.Helper()
	s, name = redistest.Shared(t), uniqueName(t)
	q = newQueue(t, s.Client(t), WithName(name))
	startQueue(t, q)
	return s, name, q
}

// leaseOwners returns the token that holds key (the lease, or the standby
// lease) of each of q's buckets; "" for a key not held.
func leaseOwners(c redis.Cmdable, q *DelayQueue, key func(bucketKeys) string) []string {
	var owners []string
	for b := range q.opts.buckets {
		v, _ := c.Get(context.Background(), key(q.keys.bucket(b))).Result()
		owner, _, _ := strings.Cut(v, " ") // "<token> <lease ms>"
		owners = append(owners, owner)
	}
	return owners
}

// secondLooksBy reports whether the second standby of the bucket of each
// of ids plans, by its lease, to look by t.
func secondLooksBy(c redis.Cmdable, q *DelayQueue, ids []string, t time.Time) bool {
	seen := map[int]bool{}
	for _, id := range ids {
		b := bucketOf(id, q.opts.buckets)
		if seen[b] {
			continue
		}
		seen[b] = true
		v, _ := c.Get(context.Background(), q.keys.bucket(b).second).Result()
		f := strings.Fields(v) // "<token> <lease ms> <next look ms>"
		if len(f) != 3 {
			return false
		}
		if at, err := strconv.ParseInt(f[2], 10, 64); err != nil || at > t.UnixMilli() {
			return false
		}
	}
	return true
}

// ownsAll reports whether q's bucket handlers own every key of owners.
func ownsAll(q *DelayQueue, owners []string) bool {
	for b, owner := range owners {
		if owner != q.handlers[b].lease.token {
			return false
		}
	}
	return true
}

// child is a helper process.
type child struct {
	cmd *exec.Cmd
	out *bufio.Scanner
	in  io.WriteCloser
}

// startChild runs the test binary as a helper and waits for its first line.
func startChild(t *testing.T, mode, addr, name string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, "DQ_ADDR="+addr, "DQ_NAME="+name)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	c := &child{cmd: cmd, out: bufio.NewScanner(stdout), in: stdin}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return c
}

// expect waits for the child's next line and checks its start.
func (c *child) expect(t *testing.T, prefix string) {
	t.Helper()
	require.True(t, c.out.Scan(), "child ended before saying %q: %v", prefix, c.out.Err())
	require.True(t, strings.HasPrefix(c.out.Text(), prefix), "child said %q, want %q", c.out.Text(), prefix)
}

// say writes a line to the child's stdin.
func (c *child) say(t *testing.T, line string) {
	t.Helper()
	_, err := io.WriteString(c.in, line+"\n")
	require.NoError(t, err)
}

func (c *child) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Signal(sig))
}

// tally counts deliveries per job ID, against the IDs that must arrive.
type tally struct {
	mu      sync.Mutex
	want    map[string]bool
	seen    map[string]int
	missing int // wanted IDs not yet seen
	n       int
}

func newTally(want []string) *tally {
	tl := &tally{want: map[string]bool{}, seen: map[string]int{}}
	for _, id := range want {
		tl.want[id] = true
	}
	tl.missing = len(tl.want)
	return tl
}

// add counts a delivery and reports whether every wanted ID has arrived.
func (tl *tally) add(id string) bool {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.seen[id]++
	tl.n++
	if tl.seen[id] == 1 && tl.want[id] {
		tl.missing--
	}
	return tl.missing == 0
}

// report logs the figures and asserts that every wanted job arrived exactly
// once. Jobs delivered that were not wanted (a push that returned an error
// but reached Redis) are counted apart.
func (tl *tally) report(t *testing.T, name string) {
	t.Helper()
	tl.mu.Lock()
	defer tl.mu.Unlock()
	dup, extra := 0, 0
	for id, n := range tl.seen {
		dup += n - 1
		if !tl.want[id] {
			extra++
		}
	}
	t.Logf("FAULT %s: pushed=%d delivered=%d lost=%d duplicated=%d delivered-though-not-acknowledged=%d",
		name, len(tl.want), tl.n, tl.missing, dup, extra)
	assert.Zero(t, tl.missing, "jobs lost")
	assert.Zero(t, dup, "jobs delivered twice")
}

// deliverAll consumes until every job of want was delivered, or timeout
// passed, and returns the tally.
func deliverAll(t *testing.T, q *DelayQueue, want []string, timeout time.Duration) *tally {
	tl := newTally(want)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	consumeInto(ctx, t, q, tl)
	return tl
}

// consumeInto pops and finishes jobs of topic "t" with several workers until
// every wanted job was delivered or ctx ends, then makes sure nothing more
// is ready.
func consumeInto(ctx context.Context, t *testing.T, q *DelayQueue, tl *tally) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				job, err := q.Pop(ctx, "t", time.Second)
				if err != nil {
					continue
				}
				_ = q.Finish(ctx, job.ID)
				if tl.add(job.ID) {
					cancel()
				}
			}
		}()
	}
	wg.Wait()
	// Whatever is still ready now would be a duplicate or an extra.
	for {
		job, err := q.Pop(context.Background(), "t", 0)
		if err != nil {
			assert.ErrorIs(t, err, ErrNoJob)
			return
		}
		_ = q.Finish(context.Background(), job.ID)
		tl.add(job.ID)
	}
}

// pushN pushes n jobs of topic "t" with PushMany and returns their IDs.
func pushN(t *testing.T, q *DelayQueue, n int, mk func(i int) *Job) []string {
	t.Helper()
	var ids []string
	for start := 0; start < n; start += 1000 {
		jobs := make([]*Job, 0, 1000)
		for i := start; i < min(n, start+1000); i++ {
			jobs = append(jobs, mk(i))
		}
		got, err := q.PushMany(context.Background(), jobs)
		require.NoError(t, err)
		for _, r := range got {
			ids = append(ids, r.ID)
		}
	}
	return ids
}
