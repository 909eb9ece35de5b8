package delayqueue

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Touch extends a popped job's reservation to its full TTR from now, for
// work that takes longer than expected, and updates job.ReservedUntil. It
// returns ErrReservationLost when job's reservation is gone or ran out
// (past ReservedUntil it is not extended, even before the job is moved
// back), and ErrNotFound when the job was removed. Consume does this by itself for the jobs it runs.
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
		args := make([]any, 0, 3*len(chunk))
		for _, i := range chunk {
			args = append(args, jobs[i].ID, jobs[i].reservation, grantFlag(jobs[i].grant != ""))
		}
		calls[c] = &scriptCall{script: scriptTouch, keys: []string{bk.pool, bk.zset, bk.grants}, args: args}
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

// The reservations of the jobs whose handlers run under Consume: extended
// in the background, in one call per bucket for the jobs that need it, so
// that no other consumer receives a job while its handler works.

// keep extends the reservations of running jobs until ctx ends: when a
// third of a job's TTR has passed since its last extension, it extends
// every job past a sixth of its own, so that jobs started together share
// their calls.
func (c *consumer) keep(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	failures := 0
	for {
		wait, ok := c.nextExtension(time.Now())
		if failures > 0 {
			wait, ok = retryBackoff(failures), true
		}
		if !ok {
			wait = time.Hour // until a job starts
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
			continue
		case <-timer.C:
		}
		if err := c.extend(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			c.q.opts.logger.Warn("delayqueue: consumer cannot extend its reservations; retrying", attrError, err)
		} else {
			failures = 0
		}
	}
}

// nextExtension is how long until a running job's reservation needs
// extending, if any does.
func (c *consumer) nextExtension(now time.Time) (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var next time.Time
	for _, r := range c.running {
		if r.lost || !now.Before(r.stop) {
			continue
		}
		at := r.renewed.Add(max(r.ref.TTR/3, time.Millisecond))
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	return max(next.Sub(now), 0), !next.IsZero()
}

// extend extends the reservations that are a sixth or more through.
func (c *consumer) extend(ctx context.Context) error {
	now := time.Now()
	var jobs []*Job
	var runs []*running
	c.mu.Lock()
	for _, r := range c.running {
		if !r.lost && now.Before(r.stop) && now.Sub(r.renewed) >= r.ref.TTR/6 {
			jobs, runs = append(jobs, r.ref), append(runs, r)
		}
	}
	c.mu.Unlock()
	if len(jobs) == 0 {
		return nil
	}
	errs := c.q.extend(ctx, jobs)
	c.mu.Lock()
	defer c.mu.Unlock()
	var failed error
	for i, r := range runs {
		switch {
		case errs[i] == nil:
			r.renewed = now
		case errors.Is(errs[i], ErrReservationLost), errors.Is(errs[i], ErrNotFound):
			// Gone to another consumer, or removed: the handler works
			// for nothing, and its ctx says why. A job gone after its
			// reservation ran out went to another consumer, which
			// finished it: the reservation is what was lost.
			cause := errs[i]
			if errors.Is(cause, ErrNotFound) && !now.Before(r.ref.ReservedUntil) {
				cause = fmt.Errorf("%w: %q", ErrReservationLost, r.ref.ID)
			}
			r.lost = true
			r.cancel(cause)
		default:
			failed = errs[i] // a Redis error: tried again soon
		}
	}
	return failed
}
