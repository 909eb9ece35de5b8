package delayqueue

import (
	"context"
	"errors"
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

// Retry tells the queue that a popped job failed with cause: it is delivered
// again after the queue's backoff for its attempt (WithBackoff), or goes to
// its topic's dead letters when it has had MaxAttempts deliveries. cause
// becomes the job's LastError. A cause that is (or wraps) ErrSkipRetry,
// RetryIn or Snooze settles the job as that outcome says instead: dead
// now, after its own delay, or back without counting the attempt. Retry
// returns ErrReservationLost when job's
// reservation is gone (it ran out and the job went back to ready or to
// another consumer) and ErrNotFound when the job was removed; then nothing
// changes.
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
	var snooze *SnoozeError
	var retryIn *RetryInError
	switch {
	case errors.Is(cause, ErrSkipRetry):
		return q.retryAfter(ctx, job, 0, cause, retryDead)
	case errors.As(cause, &snooze):
		return q.retryAfter(ctx, job, max(snooze.Delay, 0), cause, retrySnooze)
	case errors.As(cause, &retryIn):
		return q.retryAfter(ctx, job, max(retryIn.Delay, 0), retryIn.Cause, retryCounted)
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

// Touch extends a popped job's reservation to its full TTR from now, for
// work that takes longer than expected, and updates job.ReservedUntil. It
// returns ErrReservationLost when job's reservation is gone and ErrNotFound when
// the job was removed. Consume does this by itself for the jobs it runs.
func (q *DelayQueue) Touch(ctx context.Context, job *Job) error {
	if q.closed.Load() {
		return ErrClosed
	}
	if _, err := q.reservedBucket(job); err != nil {
		return err
	}
	sent := time.Now()
	if err := q.extend(ctx, []*Job{job})[0]; err != nil {
		if !errors.Is(err, ErrReservationLost) && !errors.Is(err, ErrNotFound) {
			return fmt.Errorf("delayqueue: touch %q: %w", job.ID, err)
		}
		return err
	}
	q.held.extend(job.ID, job.reservation, sent.Add(job.TTR))
	return nil
}

// maxTouch bounds how many jobs one touch call extends.
const maxTouch = 256

// extend extends the reservations of popped jobs, each to its TTR from now,
// with one script call per bucket (and per 256 jobs), all in one pipeline,
// and updates their ReservedUntil. It returns, per job, nil or why its
// reservation could not be extended: ErrReservationLost, ErrNotFound, or the
// Redis error of its bucket's call, after which nothing is known of it. It
// works on a closed queue, for Consume's handlers that outlive Close.
func (q *DelayQueue) extend(ctx context.Context, jobs []*Job) []error {
	idx := make([]int, len(jobs))
	for i := range idx {
		idx[i] = i
	}
	bucket := func(i int) int { return bucketOf(jobs[i].ID, q.opts.buckets) }
	chunks := byBucket(idx, bucket, maxTouch)
	calls := make([]*scriptCall, len(chunks))
	for c, chunk := range chunks {
		bk := q.keys.bucket(bucket(chunk[0]))
		args := make([]any, 0, 2*len(chunk))
		for _, i := range chunk {
			args = append(args, jobs[i].ID, jobs[i].reservation)
		}
		calls[c] = &scriptCall{script: scriptTouch, keys: []string{bk.pool, bk.zset}, args: args,
			settles: true, bucket: bucket(chunk[0])}
	}
	q.sendCalls(ctx, calls)
	errs := make([]error, len(jobs))
	for c, chunk := range chunks {
		res, err := calls[c].cmd.Int64Slice()
		if err == nil && len(res) != len(chunk) {
			err = fmt.Errorf("%d replies for %d jobs", len(res), len(chunk))
		}
		if err != nil {
			err = fmt.Errorf("delayqueue: extend reservations in bucket %d: %w", bucket(chunk[0]), err)
			for _, i := range chunk {
				errs[i] = err
			}
			continue
		}
		for k, i := range chunk {
			job := jobs[i]
			switch res[k] {
			case touchNoJob:
				errs[i] = fmt.Errorf("%w: %q", ErrNotFound, job.ID)
			case touchLost:
				errs[i] = fmt.Errorf("%w: %q", ErrReservationLost, job.ID)
			default:
				job.ReservedUntil = time.UnixMilli(res[k])
			}
		}
	}
	q.extendedGrants(ctx, jobs, errs)
	return errs
}

// Release gives a popped job back to its ready list at once, for another
// consumer, without counting the attempt: for a consumer that stops before
// it could work on the job. It returns ErrReservationLost when job's reservation
// is gone and ErrNotFound when the job was removed.
func (q *DelayQueue) Release(ctx context.Context, job *Job) error {
	if q.closed.Load() {
		return ErrClosed
	}
	return q.release(ctx, job)
}

// release is Release on a queue that may be closed (see finish).
func (q *DelayQueue) release(ctx context.Context, job *Job) error {
	b, err := q.reservedBucket(job)
	if err != nil {
		return err
	}
	bk := q.keys.bucket(b)
	r, err := q.run(ctx, b, scriptRelease, []string{bk.pool, bk.zset, bk.readyPrefix, bk.counts, bk.sigPrefix},
		job.ID, job.reservation).Int64()
	if err != nil {
		return fmt.Errorf("delayqueue: release %q: %w", job.ID, err)
	}
	err = reservationResult(job.ID, []int64{r})
	q.settledGrant(ctx, job.Topic, job.grant, err)
	if err != nil {
		return err
	}
	q.held.settled(job.ID, job.reservation)
	return nil
}

// reservedBucket checks a job handed back by a consumer: one that this
// queue's Pop returned, for a reservation number means nothing in another
// queue.
func (q *DelayQueue) reservedBucket(job *Job) (int, error) {
	switch {
	case job == nil:
		return 0, fmt.Errorf("%w: nil", ErrInvalidJob)
	case job.reservation == 0:
		return 0, fmt.Errorf("%w: job %q was not returned by Pop", ErrInvalidJob, job.ID)
	case job.queue != q.ident:
		return 0, fmt.Errorf("%w: job %q was popped from another queue than %q", ErrInvalidJob, job.ID, q.opts.name)
	}
	return bucketOfID(job.ID, q.opts.buckets)
}

// reservationResult reads the status that the reservation-checked scripts return first.
func reservationResult(id string, res []int64) error {
	switch {
	case len(res) == 0:
		return fmt.Errorf("delayqueue: job %q: empty reply", id)
	case res[0] == heldNoJob:
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	case res[0] == heldLost:
		return fmt.Errorf("%w: %q", ErrReservationLost, id)
	}
	return nil
}
