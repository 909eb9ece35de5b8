package delayqueue

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dqueue/delayqueue/internal/flakyconn"
	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/dqueue/delayqueue/internal/tcpproxy"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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

// TestNotifierSubscribesAgainAfterAReconnect runs the notifier on a real
// pub/sub connection: the first confirmation of a channel, the break of the
// connection, and the confirmation after go-redis subscribes again, each
// make everyone behind it look at Redis again; messages in between are
// routed.
func TestNotifierSubscribesAgainAfterAReconnect(t *testing.T) {
	forEachFlakyBackend(t, func(t *testing.T, c *redis.Client, d *flakyconn.Dialer) {
		ctx := context.Background()
		n, fakes, control := testNotifier(t, c)
		require.NoError(t, n.listenForBucket(1, fakes[1]))
		require.NoError(t, n.listenForControl())
		resyncs := func(want int) {
			t.Helper()
			require.Eventually(t, func() bool {
				_, frees := fakes[1].seen()
				return frees == want
			}, 30*time.Second, time.Millisecond)
		}
		resyncs(1) // wake.1 confirmed
		require.Eventually(t, func() bool { return len(control()) == 1 }, 30*time.Second, time.Millisecond,
			"the control channel confirmed")

		require.NoError(t, c.Publish(ctx, "wake.1", "2000").Err())
		require.Eventually(t, func() bool {
			wakes, _ := fakes[1].seen()
			return slices.Contains(wakes, 2*time.Millisecond)
		}, 30*time.Second, time.Millisecond, "a message is routed to its handler")

		release := d.Hold("subscribe")
		d.CutAll() // the pub/sub connection drops; go-redis dials again
		resyncs(2) // what was on its way is lost: everyone looks at once, before Redis confirms anything
		release()
		resyncs(3)
		wakes, _ := fakes[1].seen()
		assert.Equal(t, time.Duration(0), wakes[len(wakes)-1], "the confirmation after the reconnect has the handler look at once")
	})
}

// subscriberIDs lists the IDs of the server's pub/sub connections.
func subscriberIDs(t *testing.T, admin *redis.Client) []string {
	t.Helper()
	list, err := admin.ClientList(context.Background()).Result()
	require.NoError(t, err)
	var ids []string
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, " flags=P ") {
			id, _, _ := strings.Cut(strings.TrimPrefix(line, "id="), " ")
			ids = append(ids, id)
		}
	}
	return ids
}

// TestASilentSubscriptionIsReplaced: a pub/sub connection that goes silent
// without breaking (a peer gone, a partition), which TCP takes minutes to
// notice, is replaced once a ping goes unanswered as long as the client
// waits for a reply.
func TestASilentSubscriptionIsReplaced(t *testing.T) {
	s := redistest.Start(t)
	admin := s.Client(t)
	proxy, err := tcpproxy.Start(s.Addr, true)
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr})
	t.Cleanup(func() { _ = c.Close() })
	q := newQueue(t, c, WithSafetyPoll(time.Second))
	startQueue(t, q)

	var before []string
	require.Eventually(t, func() bool { before = subscriberIDs(t, admin); return len(before) == 1 },
		30*time.Second, 5*time.Millisecond, "the queue subscribes")

	proxy.Stall()
	require.Eventually(t, func() bool {
		return slices.ContainsFunc(subscriberIDs(t, admin), func(id string) bool { return id != before[0] })
	}, 30*time.Second, 10*time.Millisecond, "a new subscription replaces the silent one")
}

// TestASilentSubscriptionIsCheckedWhenACommandTimesOut: a call that got no
// reply in time says the link may have gone silent; the subscriptions are
// pinged then, not only at their next health check, and replaced when the
// ping goes unanswered as long as the client waits for a reply.
func TestASilentSubscriptionIsCheckedWhenACommandTimesOut(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	admin := s.Client(t)
	proxy, err := tcpproxy.Start(s.Addr, true)
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr, ReadTimeout: 300 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	q := newQueue(t, c, WithSafetyPoll(time.Hour)) // no health check within the test
	startQueue(t, q)
	var before []string
	require.Eventually(t, func() bool { before = subscriberIDs(t, admin); return len(before) == 1 },
		30*time.Second, 5*time.Millisecond, "the queue subscribes")

	proxy.Stall()
	_, err = q.Push(ctx, &Job{Topic: "t"}) // go-redis sends it again after a silent connection timed out
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return slices.ContainsFunc(subscriberIDs(t, admin), func(id string) bool { return id != before[0] })
	}, 10*time.Second, 10*time.Millisecond, "a new subscription replaces the silent one")
}

func TestAPingWaitsForItsAnswerAsLongAsTheClientWaitsForAReply(t *testing.T) {
	for _, tc := range []struct{ poll, readTimeout, want time.Duration }{
		{10 * time.Second, 3 * time.Second, 3 * time.Second},
		{10 * time.Second, -1, 10 * time.Second}, // no ReadTimeout: a whole interval
		{time.Second, 3 * time.Second, time.Second},
		{time.Millisecond, 0, time.Second}, // health checks no more often than a second
	} {
		n := newNotifier(context.Background(), notifierEnv{poll: tc.poll, readTimeout: tc.readTimeout})
		assert.Equal(t, tc.want, n.pongWait(), "poll %v, ReadTimeout %v", tc.poll, tc.readTimeout)
	}
}
