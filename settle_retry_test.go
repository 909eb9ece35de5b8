package delayqueue

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBackoffSchedule(t *testing.T) {
	b := BackoffSchedule(0, 0, 2*time.Minute, 10*time.Minute)
	var got []time.Duration
	for attempt := 1; attempt <= 6; attempt++ {
		got = append(got, b(attempt))
	}
	assert.Equal(t, []time.Duration{0, 0, 2 * time.Minute, 10 * time.Minute, 10 * time.Minute, 10 * time.Minute}, got)
	assert.Zero(t, BackoffSchedule()(3))
}

func TestExponentialBackoff(t *testing.T) {
	b := ExponentialBackoff(time.Second, 10*time.Second)
	for attempt, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 4: 8 * time.Second, 5: 10 * time.Second, 50: 10 * time.Second} {
		for range 20 {
			d := b(attempt)
			assert.GreaterOrEqual(t, d, want/2, "attempt %d", attempt)
			assert.LessOrEqual(t, d, want, "attempt %d", attempt)
		}
	}
}

func TestRetryWaitsItsBackoffThenGoesDead(t *testing.T) {
	ctx := context.Background()
	q, _, _, advance := clockQueue(t, WithBackoff(BackoffSchedule(0, 2*time.Minute)), WithMaxAttempts(3))
	id := pushed(t, q, &Job{Topic: "t", Body: []byte("b")})

	// First failure: retried at once.
	job, err := q.Pop(ctx, "t", 0)
	require.NoError(t, err)
	require.NoError(t, q.Retry(ctx, job, errors.New("smtp: 421\ntry later")))
	job, err = q.Pop(ctx, "t", 0)
	require.NoError(t, err, "a zero backoff makes the job ready at once")
	assert.Equal(t, 2, job.Attempts)
	assert.Equal(t, "smtp: 421 try later", job.LastError, "the error is kept on one line")

	// Second failure: waits two minutes.
	require.NoError(t, q.Retry(ctx, job, errors.New("again")))
	got, err := q.Get(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, StateDelayed, got.State)
	advance(2*time.Minute - time.Millisecond)
	res, err := q.moveDue(ctx, 0, "token", false)
	require.NoError(t, err)
	assert.Zero(t, res.moved)
	advance(time.Millisecond)
	res, err = q.moveDue(ctx, 0, "token", false)
	require.NoError(t, err)
	assert.Equal(t, 1, res.moved)

	// Third failure: attempts ran out.
	job, err = q.Pop(ctx, "t", 0)
	require.NoError(t, err)
	assert.Equal(t, 3, job.Attempts)
	require.NoError(t, q.Retry(ctx, job, errors.New("gave up")))
	got, err = q.Get(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, StateDead, got.State)
	assert.Equal(t, "gave up", got.LastError)
	_, err = q.Pop(ctx, "t", 0)
	assert.ErrorIs(t, err, ErrNoJob)
}

func TestStaleConsumerCannotRetryTouchOrFinish(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		startQueue(t, q)
		pushed(t, q, &Job{Topic: "t", TTR: 100 * time.Millisecond})
		stale, err := q.Pop(ctx, "t", time.Minute)
		require.NoError(t, err)
		// The reservation runs out and another consumer gets the job.
		current, err := q.Pop(ctx, "t", time.Minute)
		require.NoError(t, err)
		require.Equal(t, stale.ID, current.ID)
		require.NoError(t, q.Touch(ctx, current), "the current holder keeps it")

		assert.ErrorIs(t, q.Retry(ctx, stale, errors.New("late")), ErrReservationLost)
		assert.ErrorIs(t, q.Touch(ctx, stale), ErrReservationLost)
		assert.ErrorIs(t, q.Release(ctx, stale), ErrReservationLost)
		assert.ErrorIs(t, q.finishWithin(ctx, stale.ID, stale.reservation, "", false, 0, 0), ErrReservationLost)
		got, err := q.Get(ctx, current.ID)
		require.NoError(t, err)
		assert.Equal(t, StateReserved, got.State, "the stale consumer changed nothing")
		assert.Equal(t, 2, got.Attempts)
		assert.Contains(t, got.LastError, "reservation ran out", "the lapse is recorded")

		require.NoError(t, q.finishWithin(ctx, current.ID, current.reservation, "", false, 0, 0))
		assert.ErrorIs(t, q.Retry(ctx, current, nil), ErrNotFound, "a finished job stays finished")
		assert.ErrorIs(t, q.Touch(ctx, stale), ErrNotFound)
		_, err = q.Get(ctx, current.ID)
		assert.ErrorIs(t, err, ErrNotFound, "a late retry does not resurrect the job")
	})
}

func TestTouchExtendsTheReservation(t *testing.T) {
	ctx := context.Background()
	q, _, _, advance := clockQueue(t)
	pushed(t, q, &Job{Topic: "t", TTR: 10 * time.Second})
	job, err := q.Pop(ctx, "t", 0)
	require.NoError(t, err)
	first := job.ReservedUntil
	advance(8 * time.Second)
	require.NoError(t, q.Touch(ctx, job))
	assert.Equal(t, first.Add(8*time.Second), job.ReservedUntil)
	advance(5 * time.Second) // past the first deadline, not the new one
	res, err := q.moveDue(ctx, 0, "token", false)
	require.NoError(t, err)
	assert.Zero(t, res.moved, "a touched job is not delivered again")
	assert.Equal(t, 5*time.Second, res.next)
}

func TestReleaseGivesTheJobBackWithoutCountingTheAttempt(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		pushed(t, q, &Job{Topic: "t"})
		job, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err)
		require.NoError(t, q.Release(ctx, job))
		again, err := q.Pop(ctx, "t", time.Minute)
		require.NoError(t, err)
		assert.Equal(t, job.ID, again.ID)
		assert.Equal(t, 1, again.Attempts)
		assert.ErrorIs(t, q.Release(ctx, &Job{ID: job.ID}), ErrInvalidJob, "only a popped job can be released")
	})
}

func TestAReusedIDNeverSharesAReservationNumber(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		pushed(t, q, &Job{ID: "x", Topic: "t"})
		old, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err)
		require.NoError(t, q.Remove(ctx, "x"))
		pushed(t, q, &Job{ID: "x", Topic: "t"})
		current, err := q.Pop(ctx, "t", time.Minute)
		require.NoError(t, err)
		require.Equal(t, "x", current.ID)

		assert.ErrorIs(t, q.Release(ctx, old), ErrReservationLost, "the first job's consumer holds nothing of the second")
		assert.ErrorIs(t, q.Retry(ctx, old, nil), ErrReservationLost)
		assert.ErrorIs(t, q.finishWithin(ctx, old.ID, old.reservation, "", false, 0, 0), ErrReservationLost)
		require.NoError(t, q.finishWithin(ctx, current.ID, current.reservation, "", false, 0, 0))
	})
}

func TestPopSkipsAnIDReusedByAnotherTopic(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		pushed(t, q, &Job{ID: "y", Topic: "t"})
		require.NoError(t, q.Remove(ctx, "y"))
		pushed(t, q, &Job{ID: "y", Topic: "u"})
		_, err := q.Pop(ctx, "t", 0)
		assert.ErrorIs(t, err, ErrNoJob, "topic t has no job")
		job, err := q.Pop(ctx, "u", time.Minute)
		require.NoError(t, err)
		assert.Equal(t, "u", job.Topic)
	})
}

// A reservation number means something only in the queue that gave it: a
// job popped from another queue, even one whose job of the same ID holds
// the same number, is refused and changes nothing.
func TestAJobPoppedFromAnotherQueueIsRefused(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		other := newQueue(t, be.client, WithBuckets(1))
		pushed(t, q, &Job{ID: "real", Topic: "t"})
		pushed(t, other, &Job{ID: "real", Topic: "t"})
		own, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err)
		foreign, err := other.Pop(ctx, "t", 0)
		require.NoError(t, err)
		require.Equal(t, own.reservation, foreign.reservation, "the numbers alone cannot tell them apart")

		assert.ErrorIs(t, q.Retry(ctx, foreign, errors.New("boom")), ErrInvalidJob)
		assert.ErrorIs(t, q.RetryAfter(ctx, foreign, time.Second, errors.New("boom")), ErrInvalidJob)
		assert.ErrorIs(t, q.Touch(ctx, foreign), ErrInvalidJob)
		assert.ErrorIs(t, q.Release(ctx, foreign), ErrInvalidJob)
		got, err := q.Get(ctx, "real")
		require.NoError(t, err)
		assert.Equal(t, StateReserved, got.State)
		assert.Equal(t, own.ReservedUntil, got.ReservedUntil, "q's job is as its consumer left it")
		assert.Empty(t, got.LastError)
		require.NoError(t, q.Retry(ctx, own, errors.New("its own consumer")))
		require.NoError(t, other.Finish(ctx, foreign.ID))
	})
}

// Two instances of one queue are one queue: a job one of them popped is
// settled through the other.
func TestAJobPoppedByAnotherInstanceOfTheQueueIsSettled(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		name := uniqueName(t)
		a := newQueue(t, be.client, WithName(name))
		b := newQueue(t, be.client, WithName(name))
		pushed(t, a, &Job{ID: "j", Topic: "t"})
		job, err := a.Pop(ctx, "t", 0)
		require.NoError(t, err)
		require.NoError(t, b.Touch(ctx, job))
		require.NoError(t, b.RetryAfter(ctx, job, 0, errors.New("again")))
		got, err := b.Get(ctx, "j")
		require.NoError(t, err)
		assert.Equal(t, StateReady, got.State)
	})
}
