package delayqueue

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPauseHoldsATopicInEveryProcessUntilResume(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		name := uniqueName(t)
		admin := newQueue(t, be.client, WithName(name))
		worker := newQueue(t, be.client, WithName(name))
		startQueue(t, worker)

		require.NoError(t, admin.Pause(ctx, "t"))
		ov, err := admin.Overview(ctx)
		require.NoError(t, err)
		paused := ov.Paused
		assert.Equal(t, []string{"t"}, paused)
		// Within its refresh, the worker stops taking jobs of "t".
		require.Eventually(t, func() bool {
			pushed(t, admin, &Job{Topic: "t"})
			job, err := worker.Pop(ctx, "t", 0)
			if err == nil {
				require.NoError(t, worker.Finish(ctx, job.ID))
				return false
			}
			require.ErrorIs(t, err, ErrNoJob)
			return true
		}, 30*time.Second, time.Millisecond)
		st, err := readKeyStats(ctx, admin, "t")
		require.NoError(t, err)
		assert.Equal(t, 1, st.Ready, "the job waits in its ready list")

		// Due jobs still move while paused.
		delayed := pushed(t, admin, &Job{Topic: "t", Delay: 20 * time.Millisecond})
		require.Eventually(t, func() bool {
			got, err := admin.Get(ctx, delayed)
			return err == nil && got.State == StateReady
		}, 30*time.Second, time.Millisecond)

		// Other topics are not affected.
		other := pushed(t, admin, &Job{Topic: "u"})
		job, err := worker.Pop(ctx, "u", 0)
		require.NoError(t, err)
		assert.Equal(t, other, job.ID)

		// A waiting Pop gets both jobs once the topic is resumed.
		got := make(chan error, 1)
		go func() {
			var errs []error
			for range 2 {
				job, err := worker.Pop(ctx, "t", time.Minute)
				if err == nil {
					err = worker.Finish(ctx, job.ID)
				}
				errs = append(errs, err)
			}
			got <- errors.Join(errs...)
		}()
		require.Eventually(t, func() bool { return waitersOf(worker, "t") == 1 }, // the Pop looked, saw the pause, and waits
			30*time.Second, time.Millisecond)
		select {
		case err := <-got:
			t.Fatalf("a Pop of a paused topic returned: %v", err)
		default:
		}
		require.NoError(t, admin.Resume(ctx, "t"))
		select {
		case err := <-got:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("the resumed topic delivered nothing")
		}
		ov, err = admin.Overview(ctx)
		require.NoError(t, err)
		paused = ov.Paused
		assert.Empty(t, paused)
	})
}

func TestPauseChecksItsTopic(t *testing.T) {
	q := newQueue(t, miniredisClient(t))
	assert.ErrorIs(t, q.Pause(context.Background(), "bad topic"), ErrInvalidTopic)
	assert.ErrorIs(t, q.Resume(context.Background(), ""), ErrInvalidTopic)
}
