package delayqueue

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStats(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		fillStates(t, q)

		s, err := q.Stats(ctx, "t")
		require.NoError(t, err)
		assert.Equal(t, Stats{Jobs: 7, Scheduled: 4, Ready: 1, Dead: 1}, s)
		_, err = q.Stats(ctx, "")
		assert.ErrorIs(t, err, ErrInvalidTopic)
	})
}
