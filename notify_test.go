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

func TestAWakeUpIsNotDroppedWhenAMovesReplyIsLost(t *testing.T) {
	forEachFlakyBackend(t, func(t *testing.T, c *redis.Client, d *flakyconn.Dialer) {
		q := newQueue(t, c, WithBuckets(1), WithSafetyPoll(time.Hour))
		startQueue(t, q)
		_, err := q.Pop(context.Background(), "t", 0)
		require.ErrorIs(t, err, ErrNoJob)
		subscribed(t, q, "t")
		got := popAsync(q, "t", time.Hour)
		// The move that makes the job ready runs, but its reply is lost;
		// go-redis sends it again and that run moves nothing. Only the
		// first run's message can wake the Pop, in this very process.
		fired := d.LoseNextReply(scriptMove.on(q.plain).Hash())
		id := pushed(t, q, &Job{Topic: "t", Delay: 200 * time.Millisecond})
		assert.Equal(t, id, received(t, got).ID)
		assert.True(t, fired(), "a move's reply was lost")
	})
}

func TestNotifierSkipsTheWakeUpOfItsOwnMove(t *testing.T) {
	ctx := context.Background()
	q := newQueue(t, miniredisClient(t), WithBuckets(1), WithSafetyPoll(time.Hour))
	startQueue(t, q)
	n, err := q.notifier(ctx)
	require.NoError(t, err)
	w, err := n.watch("t")
	require.NoError(t, err)
	channel := q.keys.bucket(0).readyChannels + "t"
	h := q.handlers[0]
	woken := func(payload string) bool {
		wt := newWaiter()
		w.candidates(0, false, wt)
		defer w.leave(wt)
		n.dispatch(channel, payload, false)
		select {
		case <-wt.wake:
			return true
		default:
			return false
		}
	}

	// The handler of this process moved the jobs and woke its consumers
	// from the script's reply: its own message must not wake more.
	mark := h.lease.token + ":7:1700000000000000"
	require.True(t, h.claimWake(mark, "t"))
	assert.False(t, woken("1:"+mark), "woken by this process's own move")
	assert.True(t, woken("1:another-process:7:1700000000000000"), "not woken by another process's move")
	// A run of this process whose reply never arrived (go-redis re-sent
	// the call, and the second run found nothing to move) still wakes,
	// and then the reply, should it come, does not wake again.
	lost := h.lease.token + ":8:1700000000000123"
	assert.True(t, woken("1:"+lost), "a move's message wakes when its reply did not")
	assert.False(t, h.claimWake(lost, "t"))
	assert.True(t, h.claimWake(lost, "u"), "per topic")
}

func TestAHandlerRemembersItsLatestWakeUps(t *testing.T) {
	h := newBucketHandler(nil, 0)
	for i := range maxWoke + 1 {
		require.True(t, h.claimWake(strconv.Itoa(i), "t"))
	}
	assert.Len(t, h.woke, maxWoke, "no more than maxWoke are kept")
	assert.False(t, h.claimWake(strconv.Itoa(maxWoke), "t"), "the latest is remembered")
	assert.True(t, h.claimWake("0", "t"), "the oldest is forgotten")
}

// fakeWaker records what the notifier asks of a bucket handler.
type fakeWaker struct {
	mu      sync.Mutex
	wakes   []time.Duration
	frees   int
	ownMove string // a move mark whose notifications this handler woke for already
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

func (f *fakeWaker) wokeFromReply(mark, _ string) bool { return mark == f.ownMove }

func (f *fakeWaker) seen() ([]time.Duration, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.wakes), f.frees
}

// testNotifier is a notifier of two buckets on client, with fake bucket
// handlers, routes set up for topic "t" and nothing subscribed.
func testNotifier(t *testing.T, client redis.UniversalClient) (*notifier, []*fakeWaker) {
	n := newNotifier(context.Background(), notifierEnv{
		client:       client,
		buckets:      2,
		poll:         time.Hour,
		logger:       discard,
		wakeChannel:  func(b int) string { return "wake." + strconv.Itoa(b) },
		readyChannel: func(b int, topic string) string { return "ready." + strconv.Itoa(b) + "." + topic },
		slotMoved:    func(context.Context) {},
	})
	t.Cleanup(func() { assert.NoError(t, n.close(context.Background())) })
	fakes := []*fakeWaker{{}, {}}
	return n, fakes
}

// readyCounts reads a watch's counts and versions.
func readyCounts(w *topicWatch) ([]int, []uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.ready), slices.Clone(w.version)
}

func TestNotifierRoutesEachChannelToItsListener(t *testing.T) {
	n, fakes := testNotifier(t, nil)
	n.handlers = []bucketWaker{fakes[0], fakes[1]}
	n.routes = map[string]route{"wake.0": {bucket: 0}, "wake.1": {bucket: 1}, "ready.1.t": {bucket: 1, topic: "t"}}
	w := n.topicWatch("t")
	w.ready[0], w.ready[1] = 0, 0

	n.dispatch("wake.1", "1500", false)
	n.dispatch("wake.1", "free", false)
	n.dispatch("ready.1.t", "3", false)
	n.dispatch("ready.1.t", "2:another-process:4:17", false)

	wakes, frees := fakes[1].seen()
	assert.Equal(t, []time.Duration{1500 * time.Microsecond}, wakes, "a wake-up says how long until due, in µs")
	assert.Equal(t, 1, frees, `"free": the lease was released`)
	wakes, frees = fakes[0].seen()
	assert.Empty(t, wakes, "another bucket's handler is left alone")
	assert.Zero(t, frees)
	counts, _ := readyCounts(w)
	assert.Equal(t, []int{0, 5}, counts, "ready counts add up per bucket, whatever the mark")
}

func TestNotifierDropsWhatNobodyHereListensFor(t *testing.T) {
	n, fakes := testNotifier(t, nil)
	n.handlers = []bucketWaker{fakes[0]} // bucket 1 has no handler in this process
	fakes[0].ownMove = "mine:1:17"
	n.routes = map[string]route{"wake.0": {bucket: 0}, "wake.1": {bucket: 1},
		"ready.0.t": {bucket: 0, topic: "t"}, "ready.0.u": {bucket: 0, topic: "u"}}
	w := n.topicWatch("t")
	w.ready[0] = 0
	_, before := readyCounts(w)

	n.dispatch("elsewhere", "5", false)           // a channel never routed
	n.dispatch("wake.1", "5", false)              // a bucket this process does not move
	n.dispatch("wake.0", "soon", false)           // not a number of µs
	n.dispatch("ready.0.u", "5", false)           // a topic nobody here pops
	n.dispatch("ready.0.t", "2:mine:1:17", false) // this process's move, whose reply woke its Pops

	wakes, frees := fakes[0].seen()
	assert.Empty(t, wakes)
	assert.Zero(t, frees)
	counts, after := readyCounts(w)
	assert.Equal(t, []int{0, unknown}, counts)
	assert.Equal(t, before, after, "no notification reached the watch")

	n.dispatch("ready.0.t", "x", false)
	counts, _ = readyCounts(w)
	assert.Equal(t, 1, counts[0], "a count it cannot read stands for one job")
}

func TestNotifierResyncsEveryoneBehindAConfirmedChannel(t *testing.T) {
	n, fakes := testNotifier(t, nil)
	n.handlers = []bucketWaker{fakes[0], fakes[1]}
	n.routes = map[string]route{"wake.0": {bucket: 0}, "ready.0.t": {bucket: 0, topic: "t"}}
	w := n.topicWatch("t")
	w.ready[0], w.ready[1] = 2, 0

	n.dispatch("wake.0", "", true)
	n.dispatch("ready.0.t", "", true)

	wakes, frees := fakes[0].seen()
	assert.Equal(t, []time.Duration{0}, wakes, "the handler looks at once")
	assert.Equal(t, 1, frees, "and tries for the lease: a release may have gone unheard")
	counts, _ := readyCounts(w)
	assert.Equal(t, []int{unknown, 0}, counts, "what the channel carried may be lost: its bucket is looked at")
}
