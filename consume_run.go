package delayqueue

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"
)

// Running a job under Consume: the workers, each job's handler with its
// context, and the settling of the job by what its handler returned.

// work runs task, then the tasks handed to it, until work is closed. The
// workers live as long as fetch: a goroutine per job would grow its stack
// anew for every job. There are up to twice as many as handler slots: a
// worker frees its slot when the handler returns, and settles the job
// while another worker runs the next one.
func (c *consumer) work(task func(), work <-chan func()) {
	ended := false
	defer func() {
		if !ended {
			// A handler ended this goroutine (runtime.Goexit): another
			// worker takes its place, so that fetch's count holds.
			c.wg.Add(1)
			go c.work(nil, work)
		}
		c.wg.Done()
	}()
	for ok := true; ok; task, ok = <-work {
		if task != nil {
			task()
		}
	}
	ended = true
}

// start enlists a job whose reserve call was sent at sent (its reservation
// lasts at least its TTR from then) and whose handler starts at now, and
// returns the handler's context.
func (c *consumer) start(job *Job, sent, now time.Time) context.Context {
	maxRun := c.maxRun
	if maxRun == 0 {
		maxRun = max(defaultMaxRunTime, job.TTR)
	}
	ctx, cancelCause := context.WithCancelCause(c.ctx)
	ctx, cancelDeadline := context.WithDeadline(ctx, now.Add(maxRun))
	cancel := func(cause error) {
		cancelCause(cause)
		cancelDeadline()
	}
	r := &running{ref: &Job{ID: job.ID, Topic: job.Topic, TTR: job.TTR, ReservedUntil: job.ReservedUntil,
		reservation: job.reservation, queue: job.queue, grant: job.grant},
		cancel: cancel, renewed: sent, stop: now.Add(maxRun)}
	c.mu.Lock()
	c.running[job] = r
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
	return ctx
}

// run calls the handler on one job, calls returned, and settles the job by
// the handler's outcome: the round trip that settles it does not hold up
// the next job. A job whose grant goes on to the next job (limits_handon.go)
// keeps the slot for it: run runs that one too.
func (c *consumer) run(ctx context.Context, job *Job, returned func()) {
	for job != nil {
		job, ctx = c.runOne(ctx, job, returned)
	}
}

// runOne is run for one job; it returns the next job to run in the slot,
// and its handler's context, or nil once returned is called.
func (c *consumer) runOne(ctx context.Context, job *Job, returned func()) (*Job, context.Context) {
	err := c.call(ctx, job)
	handOn := err == nil && job.grant != "" && c.popping.Err() == nil && c.q.limiter.handsOn(job.Topic)
	switch {
	case handOn:
		// The slot waits for the next job, reserved as this one is
		// finished.
	case job.grant != "":
		// Its grant is about to come free: this process's fetch waits
		// for it rather than for Redis.
		c.q.limiter.settling(job.Topic, 1)
		defer c.q.limiter.settling(job.Topic, -1)
		returned()
	default:
		returned()
	}
	r, ours := c.finished(job)
	if r != nil {
		defer r.cancel(context.Canceled)
	}
	if !ours {
		if handOn {
			returned()
		}
		return nil, nil // released at shutdown; the job is no longer ours
	}
	// Settle even when the handlers' context has ended.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), 10*time.Second)
	defer cancel()
	log := c.q.opts.logger
	var next *Job
	var nextCtx context.Context
	switch {
	case handOn:
		sent := time.Now()
		next, err = c.q.finishHandOn(sctx, job)
		if errors.Is(err, ErrClosed) {
			// Close came meanwhile: no hand-on. The job is finished
			// alone, and its grant given back.
			err = c.q.finishWithin(sctx, job.ID, job.reservation, job.Topic, true, 0, c.concurrency)
			c.q.settledGrant(sctx, job.Topic, job.grant, err)
		}
		if next != nil && c.popping.Err() != nil {
			// Consume stopped taking jobs meanwhile: the job goes back.
			if rerr := c.q.release(sctx, next); rerr != nil {
				log.Warn("delayqueue: cannot release a job reserved at shutdown; it comes back after its TTR",
					attrTopic, next.Topic, attrJobID, next.ID, attrError, rerr)
			}
			next = nil
		}
		if next != nil {
			nextCtx = c.start(next, sent, time.Now())
		} else {
			returned()
		}
	case err == nil:
		// Its slot is free already: the finish may wait for others,
		// unless a grant comes free with it.
		within := c.q.settleWithin
		if job.grant != "" {
			within = 0
		}
		err = c.q.finishWithin(sctx, job.ID, job.reservation, job.Topic, job.grant != "", within, c.concurrency)
		c.q.settledGrant(sctx, job.Topic, job.grant, err)
	case c.ctx.Err() != nil:
		err = c.q.release(sctx, job) // stopped by shutdown, not failed
	default:
		err = c.q.retry(sctx, job, err)
	}
	if errors.Is(err, ErrReservationLost) || errors.Is(err, ErrNotFound) {
		log.Debug("delayqueue: job was no longer held when its handler returned", attrTopic, job.Topic, attrJobID, job.ID, attrError, err)
	} else if err != nil {
		log.Warn("delayqueue: cannot settle job; it comes back after its TTR", attrTopic, job.Topic, attrJobID, job.ID, attrError, err)
	}
	return next, nextCtx
}

// settleWithin bounds how long Consume holds the finish of a job, whose
// handler's slot is free already, to share a script call: with other
// finishes, or with the next reserve call to the job's bucket, which
// usually comes sooner (the reserve that fetches the next jobs; with
// 8 processes sharing a busy queue, one about every 3 ms each).
const settleWithin = 5 * time.Millisecond

// call runs the handler, turning a panic into an error.
func (c *consumer) call(ctx context.Context, job *Job) (err error) {
	start := time.Now()
	defer func() { // after the recovery below has turned a panic into err
		c.q.observe(ctx, Event{Kind: EventHandled, Topic: job.Topic, JobID: job.ID,
			Attempt: job.Attempts, Duration: time.Since(start), Err: err})
	}()
	defer func() {
		if r := recover(); r != nil {
			stack := debug.Stack()
			err = fmt.Errorf("delayqueue: handler panicked: %v\n%s", r, stack)
			c.q.opts.logger.Error("delayqueue: handler panicked", attrTopic, job.Topic, attrJobID, job.ID,
				attrAttempt, job.Attempts, "panic", fmt.Sprint(r), "stack", string(stack))
		}
	}()
	err = c.handler(ctx, job)
	snooze, snoozed := outcomeOf(err).(*SnoozeError)
	switch {
	case err == nil || c.ctx.Err() != nil:
	case snoozed: // not a failure
		c.q.opts.logger.Debug("delayqueue: handler snoozed its job", attrTopic, job.Topic, attrJobID, job.ID, "delay", snooze.Delay)
	default:
		c.q.opts.logger.Warn("delayqueue: handler failed", attrTopic, job.Topic, attrJobID, job.ID,
			attrAttempt, job.Attempts, attrError, err)
	}
	return err
}

// finished takes a job whose handler returned off the running set, and
// reports whether it was still the consumer's to settle.
func (c *consumer) finished(job *Job) (*running, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ours := c.running[job]
	delete(c.running, job)
	return r, ours
}

// releaseRunning gives the jobs whose handlers outlived the grace period
// back to ready at once.
func (c *consumer) releaseRunning() {
	c.mu.Lock()
	jobs := make([]*Job, 0, len(c.running))
	for job := range c.running {
		jobs = append(jobs, job)
	}
	clear(c.running)
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), 10*time.Second)
	defer cancel()
	for _, job := range jobs {
		if err := c.q.release(ctx, job); err != nil {
			c.q.opts.logger.Debug("delayqueue: cannot release job at shutdown", attrTopic, job.Topic, attrJobID, job.ID, attrError, err)
		}
	}
}
