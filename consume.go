package delayqueue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Handler does the work of one job. Returning nil finishes the job; an
// error or a panic retries it after the queue's backoff, or sends it to the
// dead letters once its attempts ran out; ErrSkipRetry, RetryIn and Snooze
// ask for other outcomes. ctx ends at MaxRunTime, when the grace period
// after shutdown runs out, and when the job's reservation is lost
// (context.Cause: ErrReservationLost) or the job removed (ErrNotFound).
type Handler func(ctx context.Context, job *Job) error

// Middleware wraps a Handler, to log, measure or trace around it.
type Middleware func(next Handler) Handler

// ConsumeOptions shapes Consume. The zero value is usable.
type ConsumeOptions struct {
	// Concurrency is how many handlers run at once. Default: 1. A job
	// whose handler returned is settled (finished, retried) while the next
	// job's handler already runs, so one Consume holds up to twice this
	// many jobs reserved at a time. A finish waits up to 5 ms to share a
	// script call: it rides on this process's next reserve call to the
	// job's bucket, or goes with other finishes once Concurrency of them
	// wait.
	Concurrency int
	// Grace is how long running handlers may go on after ctx ends, before
	// their contexts are cancelled and their jobs released. Default: 10s.
	Grace time.Duration
	// MaxRunTime bounds how long a handler may run on one job; until then
	// Consume extends the job's reservation whenever a third of its TTR has
	// passed. At MaxRunTime the handler's ctx ends and the extensions stop.
	// Default: 30 minutes, or the job's TTR when that is longer.
	MaxRunTime time.Duration
}

// defaultMaxRunTime is ConsumeOptions.MaxRunTime's default.
const defaultMaxRunTime = 30 * time.Minute

// Consume pops jobs of topic and runs handler on each, up to Concurrency at
// a time, extending their reservations while they run. A handler's nil
// finishes its job; an error or a panic retries it with backoff. When ctx
// ends, running handlers get Grace to return, then their jobs go back to
// ready, and Consume returns nil once every handler has returned. It
// returns ErrClosed when the queue is closed, and ErrInvalidTopic or
// ErrInvalidOption for bad arguments; Redis errors are logged and retried.
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
	case opts.MaxRunTime < 0:
		return fmt.Errorf("%w: negative MaxRunTime %v", ErrInvalidOption, opts.MaxRunTime)
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = 1
	}
	if opts.Grace == 0 {
		opts.Grace = 10 * time.Second
	}
	handler = q.wrapHandler(handler)
	q.mu.Lock()
	if q.closed.Load() {
		q.mu.Unlock()
		return ErrClosed
	}
	q.consumes.Add(1)
	q.mu.Unlock()
	defer q.consumes.Done()

	// Close ends the popping as the end of ctx does.
	popping, stopPopping := q.untilClosed(ctx)
	defer stopPopping()
	c := &consumer{q: q, handler: handler, maxRun: opts.MaxRunTime, popping: popping, concurrency: opts.Concurrency,
		running: map[*Job]*running{}, kick: make(chan struct{}, 1)}
	// Handlers outlive ctx by the grace period; their own context ends then.
	var stopHandlers context.CancelFunc
	c.ctx, stopHandlers = context.WithCancel(context.WithoutCancel(ctx))
	defer stopHandlers()
	// The keeper extends reservations until every handler has returned.
	kctx, stopKeeper := context.WithCancel(context.WithoutCancel(ctx))
	kept := make(chan struct{})
	go func() {
		defer close(kept)
		c.keep(kctx)
	}()
	defer func() {
		stopKeeper()
		<-kept
	}()

	err := c.fetch(popping, topic, opts.Concurrency)
	if err == nil && ctx.Err() == nil && q.closed.Load() {
		err = ErrClosed
	}

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
	q           *DelayQueue
	handler     Handler
	concurrency int
	maxRun      time.Duration   // 0: the default
	ctx         context.Context // the handlers' context
	popping     context.Context // Consume's ctx, ended by Close too: it takes jobs until this ends
	wg          sync.WaitGroup
	kick        chan struct{} // buffered: a job started; the keeper plans again

	mu      sync.Mutex
	running map[*Job]*running // jobs whose handlers run and that are still ours to settle
}

// running is a job whose handler runs.
type running struct {
	ref     *Job              // what the keeper passes to extend: ID, TTR, reservation
	cancel  func(cause error) // ends the handler's ctx
	renewed time.Time         // the reservation lasts at least TTR from this
	stop    time.Time         // extensions end here: the handler's ctx has ended
	lost    bool              // the reservation is gone; no more extensions
}

// fetchWait is how long one pop of a waiting Consume waits before it is
// made again. Its waits end for a job, a resume, a limit's capacity, the
// safety looks of its blocked calls (expired) and Close, not for its
// timeout; each new pop reads which topics are limited, a command an idle
// worker need not send every safety poll.
const fetchWait = time.Minute

// fetch pops jobs while handler slots are free, until ctx ends or the queue
// closes. It reserves as many jobs as slots are free, in one script call per
// bucket, so that a busy consumer does not pay a round trip per job.
func (c *consumer) fetch(ctx context.Context, topic string, concurrency int) error {
	slots := make(chan struct{}, concurrency)
	work := make(chan func())
	defer close(work) // the idle workers end
	workers := 0
	var failures errorRun
	var wait *time.Timer
	backlog := false // the last pop took as many jobs as it asked, and more wait
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
		if backlog && free < concurrency {
			// Jobs wait, and slots are about to come free (the handlers
			// of one reply end together, one after another): they go in
			// one call rather than this slot's alone and theirs after.
			free += c.gather(ctx, slots, concurrency-free)
		}
		sent := time.Now()
		jobs, err := c.q.pop(ctx, topic, free, fetchWait)
		backlog = err == nil && len(jobs) == free && c.q.jobsWait(topic)
		for range free - len(jobs) {
			<-slots
		}
		if err != nil {
			switch {
			case errors.Is(err, ErrNoJob):
				failures.ended() // the errors before were not in a row
				continue
			case ctx.Err() != nil:
				return nil
			case errors.Is(err, ErrClosed):
				return err
			}
			backoff := failures.failed()
			c.q.opts.logger.Warn("delayqueue: consumer cannot pop; retrying", attrTopic, topic, attrError, err, "failures", int(failures))
			if wait == nil {
				wait = time.NewTimer(backoff)
				defer wait.Stop()
			} else {
				wait.Reset(backoff)
			}
			select {
			case <-wait.C:
			case <-ctx.Done():
				return nil
			}
			continue
		}
		failures.ended()
		for _, job := range jobs {
			hctx := c.start(job, sent, time.Now())
			task := func() {
				// The slot is freed once, when the handler returns, or
				// when it ends its goroutine (runtime.Goexit, as a
				// test's t.FailNow does) and the deferred call runs.
				freed := false
				free := func() {
					if !freed {
						freed = true
						<-slots
					}
				}
				defer free()
				c.run(hctx, job, free)
			}
			if workers < 2*concurrency {
				select {
				case work <- task:
					continue
				default: // every worker is busy: one more
				}
				workers++
				c.wg.Add(1)
				go c.work(task, work)
				continue
			}
			work <- task // a worker has freed its slot and comes for it
		}
	}
}

// gatherWithin bounds how long a Consume whose last pop filled every
// slot it asked for, with more jobs waiting, waits for more slots to come
// free before it pops again.
const gatherWithin = 200 * time.Microsecond

// gather takes up to n more slots as they come free, for the queue's
// gatherWithin at most and until ctx ends, and returns how many it took.
func (c *consumer) gather(ctx context.Context, slots chan<- struct{}, n int) int {
	t := time.NewTimer(c.q.gatherWithin) // a new one: no tick left from the last
	defer t.Stop()
	for took := 0; ; took++ {
		if took == n {
			return took
		}
		select {
		case slots <- struct{}{}:
		case <-t.C:
			return took
		case <-ctx.Done():
			return took
		}
	}
}

// errorRun counts the failures in a row of a loop that backs off.
type errorRun int

// failed counts a failure and returns how long to back off.
func (r *errorRun) failed() time.Duration {
	*r++
	return retryBackoff(int(*r))
}

// ended ends the run: the next failure is a first.
func (r *errorRun) ended() { *r = 0 }
