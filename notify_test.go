package delayqueue

import (
	"context"
	"slices"
	"strconv"
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
// through a client whose connections d can make misbehave.
func forEachFlakyBackend(t *testing.T, f func(t *testing.T, c *redis.Client, d *flakyconn.Dialer)) {
	run := func(t *testing.T, addr string) {
		d := &flakyconn.Dialer{}
		c := redis.NewClient(&redis.Options{Addr: addr, Dialer: d.Dial, ReadTimeout: time.Second})
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

func TestPopLooksBeforeItsSubscriptionIsConfirmed(t *testing.T) {
	forEachFlakyBackend(t, func(t *testing.T, c *redis.Client, d *flakyconn.Dialer) {
		d.Stall("subscribe") // Redis never confirms a subscription
		q := newQueue(t, c, WithSafetyPoll(time.Hour))
		id := pushed(t, q, &Job{Topic: "t"})
		job := received(t, popAsync(q, "t", time.Hour))
		assert.Equal(t, id, job.ID)
	})
}

func TestStartAndCloseDoNotWaitForSubscriptions(t *testing.T) {
	forEachFlakyBackend(t, func(t *testing.T, c *redis.Client, d *flakyconn.Dialer) {
		defer verifyNoLeaks(t)()
		d.Stall("subscribe")
		q, err := New(c, WithName(uniqueName(t)), WithLogger(discard))
		require.NoError(t, err)
		started := make(chan error, 1)
		go func() { started <- q.Start(context.Background()) }()
		select {
		case err := <-started:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("Start waits for a subscription that never comes")
		}
		id := pushed(t, q, &Job{Topic: "t"})
		assert.Equal(t, id, received(t, popAsync(q, "t", time.Hour)).ID, "Pop works meanwhile")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, q.Close(ctx))
	})
}

func TestAWaitingPopLooksAgainWhenItsSubscriptionIsConfirmed(t *testing.T) {
	forEachFlakyBackend(t, func(t *testing.T, c *redis.Client, d *flakyconn.Dialer) {
		release := d.Hold("subscribe") // the subscription is on its way
		q := newQueue(t, c, WithSafetyPoll(time.Hour))
		got := popAsync(q, "t", time.Hour)
		n, err := q.notifier(context.Background())
		require.NoError(t, err)
		w := n.topicWatch("t")
		require.Eventually(t, func() bool { // the Pop looked, found nothing, and waits
			w.mu.Lock()
			defer w.mu.Unlock()
			return len(w.waiters) == 1 && !slices.ContainsFunc(w.ready, func(n int) bool { return n != 0 })
		}, 30*time.Second, time.Millisecond)
		// Published before Redis has the subscription: nobody hears it.
		id := pushed(t, q, &Job{Topic: "t"})
		release()
		assert.Equal(t, id, received(t, got).ID, "the confirmation makes the Pop look again")
	})
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
		fired := d.LoseNextReply(scriptMove.Hash())
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
	mark := h.token + ":7:1700000000000000"
	require.True(t, h.claimWake(mark, "t"))
	assert.False(t, woken("1:"+mark), "woken by this process's own move")
	assert.True(t, woken("1:another-process:7:1700000000000000"), "not woken by another process's move")
	// A run of this process whose reply never arrived (go-redis re-sent
	// the call, and the second run found nothing to move) still wakes,
	// and then the reply, should it come, does not wake again.
	lost := h.token + ":8:1700000000000123"
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
