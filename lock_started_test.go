package delayqueue

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWaitingConsumersWarnWhenNoProcessStartedTheQueue(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		logs := &capture{}
		q := newQueue(t, be.client, WithSafetyPoll(20*time.Millisecond), WithLogger(logs.logger()))
		require.Eventually(t, func() bool {
			_, err := q.Pop(ctx, "t", 50*time.Millisecond)
			require.ErrorIs(t, err, ErrNoJob)
			return strings.Contains(logs.String(), "no process has started this queue")
		}, 30*time.Second, time.Millisecond)
		assert.Contains(t, logs.String(), "call Start in at least one process")
		assert.Equal(t, 1, strings.Count(logs.String(), "no process has started"), "once")
	})
}

// A Consume that waits long (its pops wait a minute) warns as soon: a
// waiting pop looks each safety poll.
func TestALongWaitWarnsAfterASafetyPollOrTwo(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		logs := &capture{}
		q := newQueue(t, be.client, WithSafetyPoll(20*time.Millisecond), WithLogger(logs.logger()))
		done := make(chan error, 1)
		go func() {
			done <- q.Consume(ctx, "t", func(context.Context, *Job) error { return nil }, ConsumeOptions{})
		}()
		require.Eventually(t, func() bool {
			return strings.Contains(logs.String(), "no process has started this queue")
		}, 30*time.Second, time.Millisecond, "well before the pop's minute")
		cancel()
		require.NoError(t, <-done)
	})
}

func TestWaitingConsumersStayQuietWhileAnotherProcessHasStarted(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		name := uniqueName(t)
		startQueue(t, newQueue(t, be.client, WithName(name)))
		logs := &capture{}
		q := newQueue(t, be.client, WithName(name), WithSafetyPoll(20*time.Millisecond), WithLogger(logs.logger()))
		looks := func() int {
			q.startWatch.mu.Lock()
			defer q.startWatch.mu.Unlock()
			return q.startWatch.looks
		}
		require.Eventually(t, func() bool {
			_, err := q.Pop(ctx, "t", 50*time.Millisecond)
			require.ErrorIs(t, err, ErrNoJob)
			return looks() >= 4 // the warning would have come after two
		}, 30*time.Second, time.Millisecond)
		assert.NotContains(t, logs.String(), "no process has started")
	})
}
