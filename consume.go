package delayqueue

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"
)

// Handler does the work of one job. Returning nil finishes the job; an error
// (or a panic) retries it after the queue's backoff, or sends it to the dead
// letters when its attempts ran out. ctx ends when the consumer's grace
// period after shutdown runs out.
type Handler func(ctx context.Context, job *Job) error

// Middleware wraps a Handler, to log, measure or trace around it.
type Middleware func(next Handler) Handler

// ConsumeOptions shapes Consume. The zero value is usable.
type ConsumeOptions struct {
	// Concurrency is how many handlers run at once. Default: 1.
	Concurrency int
	// Grace is how long running handlers may go on after ctx ends, before
	// their contexts are cancelled and their jobs released. Default: 10s.
	Grace time.Duration
	// Middleware wraps the handler; the first is outermost.
	Middleware []Middleware
}

// Consume pops jobs of topic and runs handler on each, up to Concurrency at a
// time, until ctx ends or the queue is closed. A handler's success finishes
// its job; an error or a panic retries it with backoff and records the
// error as the job's LastError. When ctx ends, Consume stops popping, lets
// running handlers finish for up to Grace, then cancels their contexts and
// releases their jobs back to ready at once (the attempt does not count),
// and returns nil once every handler has returned: a handler that ignores
// its context holds Consume until it returns. Consume returns ErrClosed
// when the queue is closed, and ErrInvalidTopic or ErrInvalidOption for bad
// arguments. A Redis error while popping is logged and retried with
// backoff.
func (q *DelayQueue) Consume(ctx context.Context, topic string, handler Handler, opts ConsumeOptions) error {
	if err := q.checkTopic(topic); err != nil {
		return err
	}
	switch {
	case handler == nil:
		return fmt.Errorf("%w: nil handler", ErrInvalidOption)
	case opts.Concurrency < 0:
		return fmt.Errorf("%w: negative concurrency %d", ErrInvalidOption, opts.Concurrency)
	case opts.Grace < 0:
		return fmt.Errorf("%w: negative grace %v", ErrInvalidOption, opts.Grace)
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = 1
	}
	if opts.Grace == 0 {
		opts.Grace = 10 * time.Second
	}
	for i := len(opts.Middleware) - 1; i >= 0; i-- {
		if opts.Middleware[i] == nil {
			return fmt.Errorf("%w: nil middleware", ErrInvalidOption)
		}
		handler = opts.Middleware[i](handler)
	}

	c := &consumer{q: q, handler: handler, running: map[*Job]bool{}}
	// Handlers outlive ctx by the grace period; their own context ends then.
	var stopHandlers context.CancelFunc
	c.ctx, stopHandlers = context.WithCancel(context.WithoutCancel(ctx))
	defer stopHandlers()

	err := c.fetch(ctx, topic, opts.Concurrency)

	done := make(chan struct{})
	go func() {
		c.wg.Wait()
		close(done)
	}()
	grace := time.NewTimer(opts.Grace)
	defer grace.Stop()
	select {
	case <-done:
	case <-grace.C:
		stopHandlers()
		c.releaseRunning()
		<-done
	}
	return err
}

type consumer struct {
	q       *DelayQueue
	handler Handler
	ctx     context.Context // the handlers' context
	wg      sync.WaitGroup

	mu      sync.Mutex
	running map[*Job]bool // jobs whose handlers run and that are still ours to settle
}

// fetch pops jobs while handler slots are free, until ctx ends or the queue
// closes. It reserves as many jobs as slots are free, in one script call per
// bucket, so that a busy consumer does not pay a round trip per job.
func (c *consumer) fetch(ctx context.Context, topic string, concurrency int) error {
	slots := make(chan struct{}, concurrency)
	failures := 0
	var wait *time.Timer
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		free := 1
	more:
		for free < concurrency {
			select {
			case slots <- struct{}{}:
				free++
			default:
				break more
			}
		}
		jobs, err := c.q.pop(ctx, topic, free, c.q.opts.poll)
		for range free - len(jobs) {
			<-slots
		}
		if err != nil {
			switch {
			case errors.Is(err, ErrNoJob):
				continue
			case ctx.Err() != nil:
				return nil
			case errors.Is(err, ErrClosed):
				return err
			}
			failures++
			c.q.opts.logger.Warn("delayqueue: consumer cannot pop; retrying", attrTopic, topic, attrError, err)
			if wait == nil {
				wait = time.NewTimer(retryBackoff(failures))
				defer wait.Stop()
			} else {
				wait.Reset(retryBackoff(failures))
			}
			select {
			case <-wait.C:
			case <-ctx.Done():
				return nil
			}
			continue
		}
		failures = 0
		for _, job := range jobs {
			c.track(job, true)
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				defer func() { <-slots }()
				c.run(job)
			}()
		}
	}
}

// run calls the handler on one job and settles the job by its outcome.
func (c *consumer) run(job *Job) {
	err := c.call(job)
	if !c.track(job, false) {
		return // released at shutdown; the job is no longer ours
	}
	// Settle even when the handlers' context has ended.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), 10*time.Second)
	defer cancel()
	log := c.q.opts.logger
	switch {
	case err == nil:
		err = c.q.finish(ctx, job.ID, job.lease)
	case c.ctx.Err() != nil:
		err = c.q.release(ctx, job) // stopped by shutdown, not failed
	default:
		err = c.q.retry(ctx, job, err)
	}
	if errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrNotFound) {
		log.Debug("delayqueue: job was no longer held when its handler returned", attrTopic, job.Topic, attrJobID, job.ID, attrError, err)
	} else if err != nil {
		log.Warn("delayqueue: cannot settle job; it comes back after its TTR", attrTopic, job.Topic, attrJobID, job.ID, attrError, err)
	}
}

// call runs the handler, turning a panic into an error.
func (c *consumer) call(job *Job) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("delayqueue: handler panicked: %v\n%s", r, debug.Stack())
		}
	}()
	return c.handler(c.ctx, job)
}

// track adds a job to, or takes it off, the running set. Taking off reports
// whether the job was still the consumer's to settle.
func (c *consumer) track(job *Job, add bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if add {
		c.running[job] = true
		return true
	}
	ours := c.running[job]
	delete(c.running, job)
	return ours
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
