package delayqueue

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Backoff returns how long a job waits before its next delivery after its
// attempt-th delivery failed (attempt counts from 1). A negative wait counts
// as zero.
type Backoff func(attempt int) time.Duration

// BackoffSchedule retries after the given delays in turn: the first after
// the first failure, and so on; past the end, the last delay repeats. With
// MaxAttempts one more than the delays, the schedule ends in the dead
// letters. BackoffSchedule() with no delays retries at once.
func BackoffSchedule(delays ...time.Duration) Backoff {
	delays = append([]time.Duration(nil), delays...)
	return func(attempt int) time.Duration {
		if len(delays) == 0 {
			return 0
		}
		return delays[min(max(attempt, 1), len(delays))-1]
	}
}

// ExponentialBackoff waits base after the first failure and doubles the wait
// after each further one, up to limit, each wait picked at random between
// half and all of it (jitter), so that jobs failed together do not all come
// back together. The doubling saturates at limit, however large: it never
// wraps around to a short wait. A base or limit of zero or less retries at
// once.
func ExponentialBackoff(base, limit time.Duration) Backoff {
	return func(attempt int) time.Duration {
		if base <= 0 || limit <= 0 {
			return 0
		}
		d := min(base, limit)
		for i := 1; i < attempt && d < limit; i++ {
			if d > limit/2 {
				d = limit
			} else {
				d *= 2
			}
		}
		return d/2 + rand.N(d/2+1)
	}
}

// maxErrorLen bounds the error text kept with a job.
const maxErrorLen = 1024

// errorText turns a failure into the one-line text kept as LastError.
func errorText(cause error) string {
	if cause == nil {
		return "retried"
	}
	s := strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, cause.Error())
	if len(s) > maxErrorLen {
		s = s[:maxErrorLen]
	}
	return s
}

// Retry tells the queue that a popped job failed with cause, which becomes
// its LastError: it is delivered again after the queue's backoff
// (WithBackoff), or goes to the dead letters after MaxAttempts deliveries.
// A cause that is or wraps ErrSkipRetry, RetryIn or Snooze settles the job
// as that outcome says. Retry returns ErrReservationLost when job's
// reservation is gone and ErrNotFound when the job was removed.
func (q *DelayQueue) Retry(ctx context.Context, job *Job, cause error) error {
	if q.closed.Load() {
		return ErrClosed
	}
	return q.retry(ctx, job, cause)
}

// retry is Retry on a queue that may be closed (see finish). It settles the
// job by the outcome cause names (ErrSkipRetry, RetryIn, Snooze), or else
// retries it after the queue's backoff.
func (q *DelayQueue) retry(ctx context.Context, job *Job, cause error) error {
	if job == nil {
		return fmt.Errorf("%w: nil", ErrInvalidJob)
	}
	switch o := outcomeOf(cause).(type) {
	case *SnoozeError:
		return q.retryAfter(ctx, job, max(o.Delay, 0), cause, retrySnooze)
	case *RetryInError:
		return q.retryAfter(ctx, job, max(o.Delay, 0), o.Cause, retryCounted)
	case error: // ErrSkipRetry, the only other outcome
		return q.retryAfter(ctx, job, 0, cause, retryDead)
	}
	// A Backoff of the user's that returns a negative wait retries at once.
	return q.retryAfter(ctx, job, max(q.opts.backoff(job.Attempts), 0), cause, retryCounted)
}

// RetryAfter is Retry with the delay given instead of the queue's backoff.
// A negative delay returns ErrInvalidJob.
func (q *DelayQueue) RetryAfter(ctx context.Context, job *Job, delay time.Duration, cause error) error {
	if q.closed.Load() {
		return ErrClosed
	}
	return q.retryAfter(ctx, job, delay, cause, retryCounted)
}

// retry.lua's modes.
const (
	retryCounted = "retry"  // the attempt counts; dead when they ran out
	retryDead    = "dead"   // to the dead letters now
	retrySnooze  = "snooze" // back after the delay, the attempt not counted
)

func (q *DelayQueue) retryAfter(ctx context.Context, job *Job, delay time.Duration, cause error, mode string) error {
	b, err := q.reservedBucket(job)
	if err != nil {
		return err
	}
	if delay < 0 {
		return fmt.Errorf("%w: negative retry delay %v", ErrInvalidJob, delay)
	}
	bk := q.keys.bucket(b)
	res, err := q.run(ctx, b, scriptRetry,
		[]string{bk.pool, bk.zset, bk.readyPrefix, bk.deadPrefix, bk.deadTopics, bk.counts, bk.sigPrefix},
		job.ID, job.reservation, ceilMs(delay), errorText(cause), bk.wake, q.pub, mode,
	).Int64Slice()
	if err != nil {
		return fmt.Errorf("delayqueue: retry %q: %w", job.ID, err)
	}
	err = reservationResult(job.ID, res)
	q.settledGrant(ctx, job.Topic, job.grant, err)
	if err != nil {
		return err
	}
	q.held.settled(job.ID, job.reservation)
	kind := EventRetried
	switch {
	case res[0] == retryDied:
		kind = EventDead
	case mode == retrySnooze:
		kind = EventSnoozed
	}
	q.observe(ctx, Event{Kind: kind, Topic: job.Topic, JobID: job.ID, Attempt: job.Attempts, Err: cause})
	return nil
}
