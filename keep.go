package delayqueue

import (
	"context"
	"errors"
	"time"
)

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
			// for nothing, and its ctx says why.
			r.lost = true
			r.cancel(errs[i])
		default:
			failed = errs[i] // a Redis error: tried again soon
		}
	}
	return failed
}
