package delayqueue

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRetryHonoursTheOutcomeItsCauseNames(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBackoff(BackoffSchedule(time.Hour)), WithMaxAttempts(5))
		pop := func(id string) *Job {
			t.Helper()
			job, err := q.Pop(ctx, "t", 0)
			require.NoError(t, err)
			require.Equal(t, id, job.ID)
			return job
		}
		state := func(id string) *Job {
			t.Helper()
			got, err := q.Get(ctx, id)
			require.NoError(t, err)
			return got
		}

		// Dead now, four attempts left.
		id := pushed(t, q, &Job{Topic: "t"})
		died := time.Now()
		require.NoError(t, q.Retry(ctx, pop(id), fmt.Errorf("webhook answered 404: %w", ErrSkipRetry)))
		got := state(id)
		assert.Equal(t, StateDead, got.State)
		assert.WithinRange(t, got.DiedAt, died.Add(-5*time.Second), time.Now().Add(5*time.Second), "when it died, in a field of its own")
		dead, err := listJobs(ctx, q, "t", StateDead, 10)
		require.NoError(t, err)
		require.Len(t, dead, 1)
		assert.Equal(t, got.DiedAt, dead[0].DiedAt)
		assert.Equal(t, 1, got.Attempts)
		assert.Equal(t, "webhook answered 404: delayqueue: skip retry", got.LastError)

		// Its own delay instead of the hour of backoff; the attempt counts.
		id = pushed(t, q, &Job{Topic: "t"})
		before := time.Now()
		require.NoError(t, q.Retry(ctx, pop(id), fmt.Errorf("wrapped: %w", RetryIn(2*time.Minute, errors.New("429")))))
		got = state(id)
		assert.Equal(t, StateDelayed, got.State)
		assert.Equal(t, "429", got.LastError, "the cause given to RetryIn")
		assert.WithinRange(t, got.RunAt, before.Add(2*time.Minute-time.Second), before.Add(2*time.Minute+10*time.Second))
		require.NoError(t, q.RescheduleIn(ctx, id, 0))
		assert.Equal(t, 2, pop(id).Attempts)

		// Snoozed: back after its delay, the attempt not counted, no error.
		id = pushed(t, q, &Job{Topic: "t", MaxAttempts: 1})
		job := pop(id)
		require.NoError(t, q.Retry(ctx, job, Snooze(time.Minute)))
		got = state(id)
		assert.Equal(t, StateDelayed, got.State, "not dead, though its one attempt was used")
		assert.Zero(t, got.Attempts)
		assert.Empty(t, got.LastError)
		require.NoError(t, q.RescheduleIn(ctx, id, 0))
		assert.Equal(t, 1, pop(id).Attempts)

		// A negative delay, as a Retry-After date already past gives:
		// back at once, where RetryAfter refuses it.
		id = pushed(t, q, &Job{Topic: "t"})
		job = pop(id)
		assert.ErrorIs(t, q.RetryAfter(ctx, job, -time.Hour, errors.New("past")), ErrInvalidJob)
		assert.Equal(t, StateReserved, state(id).State, "the refused call changed nothing")
		require.NoError(t, q.Retry(ctx, job, RetryIn(-time.Hour, errors.New("past"))))
		job = pop(id)
		assert.Equal(t, 2, job.Attempts, "ready at once, the attempt counted")
		require.NoError(t, q.Retry(ctx, job, Snooze(-time.Hour)))
		assert.Equal(t, 2, pop(id).Attempts, "ready at once, the attempt not counted")
	})
}

func TestConsumeSettlesByTheHandlersOutcome(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBackoff(BackoffSchedule(time.Hour)), WithMaxAttempts(5))
		dead := pushed(t, q, &Job{Topic: "t", Body: []byte("dead")})
		snoozed := pushed(t, q, &Job{Topic: "t", Body: []byte("snooze")})
		var ran atomic.Int32
		consumeUntil(t, q, func(_ context.Context, job *Job) error {
			ran.Add(1)
			if string(job.Body) == "dead" {
				return fmt.Errorf("bad request: %w", ErrSkipRetry)
			}
			return Snooze(time.Hour)
		}, ConsumeOptions{Concurrency: 2}, func() bool { return ran.Load() == 2 })
		require.Eventually(t, func() bool {
			d, err1 := q.Get(ctx, dead)
			s, err2 := q.Get(ctx, snoozed)
			return err1 == nil && err2 == nil && d.State == StateDead && s.State == StateDelayed
		}, 30*time.Second, time.Millisecond)
		s, err := q.Get(ctx, snoozed)
		require.NoError(t, err)
		assert.Zero(t, s.Attempts, "a snooze does not count")
	})
}

func TestOutcomeErrorsReadAndUnwrap(t *testing.T) {
	cause := errors.New("429")
	err := RetryIn(time.Second, cause)
	assert.EqualError(t, err, "delayqueue: retry in 1s: 429")
	assert.ErrorIs(t, err, cause)
	var r *RetryInError
	require.ErrorAs(t, fmt.Errorf("x: %w", err), &r)
	assert.Equal(t, time.Second, r.Delay)
	var s *SnoozeError
	require.ErrorAs(t, fmt.Errorf("x: %w", Snooze(time.Minute)), &s)
	assert.Equal(t, time.Minute, s.Delay)
	assert.EqualError(t, Snooze(time.Minute), "delayqueue: snooze for 1m0s")
}

func TestConsumeLogsHandlerErrorsAndPanics(t *testing.T) {
	ctx := context.Background()
	logs := &capture{}
	q := newQueue(t, miniredisClient(t), WithBackoff(BackoffSchedule(0)), WithLogger(logs.logger()))
	id := pushed(t, q, &Job{Topic: "t"})
	var calls atomic.Int32
	consumeUntil(t, q, func(_ context.Context, job *Job) error {
		switch calls.Add(1) {
		case 1:
			return errors.New("smtp said no")
		case 2:
			panic("nil map")
		}
		return nil
	}, ConsumeOptions{}, func() bool {
		_, err := q.Get(ctx, id)
		return errors.Is(err, ErrNotFound)
	})
	out := logs.String()
	assert.Contains(t, out, `msg="delayqueue: handler failed" topic=t job_id=`+id+` attempt=1 error="smtp said no"`)
	assert.Contains(t, out, `msg="delayqueue: handler panicked" topic=t job_id=`+id+` attempt=2 panic="nil map" stack=`)
	assert.Contains(t, out, "TestConsumeLogsHandlerErrorsAndPanics", "the stack names the handler")
}

// When an error names more than one outcome, the outermost wins: a
// RetryIn whose cause wraps ErrSkipRetry or a Snooze retries after its
// delay, and a joined error's first outcome wins. A nil outcome error
// names none, and reads without a panic.
func TestTheOutermostOutcomeWins(t *testing.T) {
	skip := fmt.Errorf("lower layer: %w", ErrSkipRetry)
	for name, tc := range map[string]struct {
		err  error
		want error
	}{
		"RetryIn over ErrSkipRetry":    {RetryIn(time.Hour, skip), &RetryInError{}},
		"RetryIn over Snooze":          {fmt.Errorf("x: %w", RetryIn(time.Hour, Snooze(time.Minute))), &RetryInError{}},
		"Snooze first in a join":       {errors.Join(Snooze(time.Hour), ErrSkipRetry), &SnoozeError{}},
		"ErrSkipRetry first in a join": {errors.Join(errors.New("a"), skip, Snooze(time.Hour)), ErrSkipRetry},
		"none":                         {errors.New("plain"), nil},
		"a nil RetryInError":           {(*RetryInError)(nil), nil},
		"a nil SnoozeError, wrapped":   {fmt.Errorf("x: %w", (*SnoozeError)(nil)), nil},
	} {
		got := outcomeOf(tc.err)
		if tc.want == nil {
			assert.Nil(t, got, name)
			continue
		}
		assert.IsType(t, tc.want, got, name)
		assert.NotEmpty(t, tc.err.Error(), name)
	}
	assert.NotPanics(t, func() {
		var r *RetryInError
		_ = errors.As(fmt.Errorf("x: %w", (*RetryInError)(nil)), &r)
		_ = (*RetryInError)(nil).Error()
		_ = (*SnoozeError)(nil).Error()
	})

	// Retry settles by it: retried after the hour, not dead.
	ctx := context.Background()
	q := newQueue(t, miniredisClient(t))
	id := pushed(t, q, &Job{Topic: "t"})
	job, err := q.Pop(ctx, "t", 0)
	require.NoError(t, err)
	require.NoError(t, q.Retry(ctx, job, RetryIn(time.Hour, skip)))
	got, err := q.Get(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, StateDelayed, got.State)
	assert.Equal(t, "lower layer: delayqueue: skip retry", got.LastError)
}
