package delayqueue

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStats(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		killJobs(t, q, "t", 1)
		for range 3 {
			pushed(t, q, &Job{Topic: "t", Delay: time.Hour})
		}
		for range 2 {
			pushed(t, q, &Job{Topic: "t"})
		}
		pushed(t, q, &Job{Topic: "other"})
		job, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err) // one reserved
		require.NotNil(t, job)

		s, err := q.Stats(ctx, "t")
		require.NoError(t, err)
		assert.Equal(t, Stats{Jobs: 7, Scheduled: 4, Ready: 1, Dead: 1}, s)
		_, err = q.Stats(ctx, "")
		assert.ErrorIs(t, err, ErrInvalidTopic)
	})
}
