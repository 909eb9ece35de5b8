package delayqueue

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/dqueue/delayqueue/internal/flakyconn"
	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// forEachFlakyBackend runs f against miniredis and a real redis-server,
// through a client whose connections d can make misbehave; set changes the
// client's options.
func forEachFlakyBackend(t *testing.T, f func(t *testing.T, c *redis.Client, d *flakyconn.Dialer), set ...func(*redis.Options)) {
	run := func(t *testing.T, addr string) {
		d := &flakyconn.Dialer{}
		o := &redis.Options{Addr: addr, Dialer: d.Dial, ReadTimeout: time.Second}
		for _, s := range set {
			s(o)
		}
		c := redis.NewClient(o)
		t.Cleanup(func() { _ = c.Close() })
		f(t, c, d)
	}
	t.Run("miniredis", func(t *testing.T) { run(t, miniredis.RunT(t).Addr()) })
	t.Run("redis", func(t *testing.T) { run(t, redistest.Shared(t).Addr) })
}

// popAsync pops in the background; the result arrives on the channel.
func popAsync(q *DelayQueue, topic string, timeout time.Duration) <-chan *Job {
	got := make(chan *Job, 1)
	go func() {
		job, _ := q.Pop(context.Background(), topic, timeout)
		got <- job
	}()
	return got
}

// received waits, without a tight bound, for a popped job.
func received(t *testing.T, got <-chan *Job) *Job {
	t.Helper()
	select {
	case job := <-got:
		require.NotNil(t, job)
		return job
	case <-time.After(30 * time.Second):
		t.Fatal("no job within 30s")
		return nil
	}
}

// fakeWaker records what the notifier asks of a bucket handler.
type fakeWaker struct {
	mu    sync.Mutex
	wakes []time.Duration
	frees int
}

func (f *fakeWaker) wake(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.wakes = append(f.wakes, d)
}

func (f *fakeWaker) leaseFreed() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.frees++
}

func (f *fakeWaker) seen() ([]time.Duration, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.wakes), f.frees
}

// testNotifier is a notifier of two buckets on client, with fake bucket
// handlers, routes set up, nothing subscribed, and the control messages it
// receives recorded.
func testNotifier(t *testing.T, client redis.UniversalClient) (*notifier, []*fakeWaker, func() []string) {
	var mu sync.Mutex
	var control []string
	n := newNotifier(context.Background(), notifierEnv{
		client:      client,
		poll:        time.Hour,
		logger:      discard,
		wakeChannel: func(b int) string { return "wake." + strconv.Itoa(b) },
		control:     "control",
		slotMoved:   func(context.Context) {},
		controlled: func(msg string) {
			mu.Lock()
			defer mu.Unlock()
			control = append(control, msg)
		},
	})
	t.Cleanup(func() { assert.NoError(t, n.close(context.Background())) })
	fakes := []*fakeWaker{{}, {}}
	n.handlers = map[int]bucketWaker{0: fakes[0], 1: fakes[1]}
	n.routes = map[string]route{"wake.0": {bucket: 0}, "wake.1": {bucket: 1}, "control": {control: true}}
	return n, fakes, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(control)
	}
}

func TestNotifierRoutesEachChannelToItsListener(t *testing.T) {
	n, fakes, control := testNotifier(t, nil)
	n.dispatch("wake.1", "1500", false)
	n.dispatch("wake.1", "free", false)
	n.dispatch("control", "resume:t", false)

	wakes, frees := fakes[1].seen()
	assert.Equal(t, []time.Duration{1500 * time.Microsecond}, wakes, "a wake-up says how long until due, in µs")
	assert.Equal(t, 1, frees, `"free": the lease was released`)
	wakes, frees = fakes[0].seen()
	assert.Empty(t, wakes, "another bucket's handler is left alone")
	assert.Zero(t, frees)
	assert.Equal(t, []string{"resume:t"}, control())
}

func TestNotifierDropsWhatNobodyHereListensFor(t *testing.T) {
	n, fakes, control := testNotifier(t, nil)
	delete(n.handlers, 1)               // bucket 1 has no handler listening in this process
	n.dispatch("elsewhere", "5", false) // a channel never routed
	n.dispatch("wake.1", "5", false)    // a bucket this process does not listen for
	n.dispatch("wake.0", "soon", false) // not a number of µs

	wakes, frees := fakes[0].seen()
	assert.Empty(t, wakes)
	assert.Zero(t, frees)
	assert.Empty(t, control())
}

func TestNotifierResyncsEveryoneBehindAConfirmedChannel(t *testing.T) {
	n, fakes, control := testNotifier(t, nil)
	n.dispatch("wake.0", "", true)
	n.dispatch("control", "", true)

	wakes, frees := fakes[0].seen()
	assert.Equal(t, []time.Duration{0}, wakes, "the handler looks at once")
	assert.Equal(t, 1, frees, "and tries for the lease: a release may have gone unheard")
	assert.Equal(t, []string{""}, control(), "what the control channel carried may be lost: everyone looks again")
}
