package delayqueue

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestErrLeaseLostIsTheReservationError(t *testing.T) {
	err := fmt.Errorf("%w: %q", ErrReservationLost, "~abc")
	assert.ErrorIs(t, err, ErrLeaseLost, "code written against the former name still matches")
	assert.ErrorIs(t, fmt.Errorf("wrapped: %w", ErrLeaseLost), ErrReservationLost)
	assert.False(t, errors.Is(ErrReservationLost, ErrNotFound))
}
