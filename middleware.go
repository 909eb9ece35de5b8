package delayqueue

import (
	"context"
	"fmt"
)

// Middleware of the whole queue: code of another package (tracing, such as
// dqotel's) that wraps every push and every Consume handler. The root
// package knows nothing of what it does.

// PushFunc stores the jobs of one push call: one job for Push and Upsert,
// all of them for PushMany. It returns the call's error.
type PushFunc func(ctx context.Context, jobs []*Job) error

// PushMiddleware wraps every push of a queue (WithPushMiddleware), to trace
// or measure it, or to add to the jobs' Headers. It is called once per push
// call, after the jobs passed the queue's checks and each job without an ID
// got one, and before they are encoded: what it sets in a job's Headers is
// stored with the job. It must call next with the jobs it was given, at
// most once, and should return next's error. The jobs are checked again
// after it, so a change that breaks a limit fails the push with
// ErrInvalidJob. In the rare case that a generated ID is found taken (see
// Job.ID), next gives the job another: read job.ID once next returned.
type PushMiddleware func(next PushFunc) PushFunc

// WithPushMiddleware wraps every push of the queue in mw: Push, PushMany and
// Upsert. The first is outermost; middleware given by several options runs
// in the order given. Default: none, and then a push does no work for it.
func WithPushMiddleware(mw ...PushMiddleware) Option {
	return optionFunc(func(o *options) { o.pushMiddleware = append(o.pushMiddleware, mw...) })
}

// WithConsumeMiddleware wraps the handler of every Consume of the queue in
// mw: one option puts tracing around every consumer. The first is
// outermost; middleware given by several options runs in the order given.
// Default: none. To wrap the handler of one Consume, wrap it before
// passing it.
func WithConsumeMiddleware(mw ...Middleware) Option {
	return optionFunc(func(o *options) { o.consumeMiddleware = append(o.consumeMiddleware, mw...) })
}

// validateMiddleware refuses a nil middleware.
func (o *options) validateMiddleware() error {
	for _, mw := range o.pushMiddleware {
		if mw == nil {
			return fmt.Errorf("%w: nil push middleware", ErrInvalidOption)
		}
	}
	for _, mw := range o.consumeMiddleware {
		if mw == nil {
			return fmt.Errorf("%w: nil consume middleware", ErrInvalidOption)
		}
	}
	return nil
}

// throughPush runs store on jobs inside the push middleware. The jobs were
// checked; those without an ID get one first, so that the middleware sees
// it. store checks them again: the middleware may have changed them.
func (q *DelayQueue) throughPush(ctx context.Context, jobs []*Job, store PushFunc) error {
	epoch := q.idEpoch()
	for _, job := range jobs {
		if job.ID == "" {
			job.ID = q.ids.nextIn(q.opts.buckets, epoch)
		}
	}
	for i := len(q.opts.pushMiddleware) - 1; i >= 0; i-- {
		store = q.opts.pushMiddleware[i](store)
	}
	return store(ctx, jobs)
}

// throughPushOne runs push, which stores one job as prepare checked and
// encoded it, inside the push middleware.
func (q *DelayQueue) throughPushOne(ctx context.Context, job *Job, push func(context.Context, *Job, pushArgs) (PushResult, error)) (PushResult, error) {
	var res PushResult
	err := q.throughPush(ctx, []*Job{job}, func(ctx context.Context, jobs []*Job) error {
		a, err := q.opts.prepare(jobs[0])
		if err == nil {
			res, err = push(ctx, jobs[0], a)
		}
		return err
	})
	return res, err
}

// throughPushMany runs pushMany inside the push middleware.
func (q *DelayQueue) throughPushMany(ctx context.Context, jobs []*Job) ([]PushResult, error) {
	var res []PushResult
	err := q.throughPush(ctx, jobs, func(ctx context.Context, jobs []*Job) error {
		args, err := q.opts.prepareAll(jobs)
		if err == nil {
			res, err = q.pushMany(ctx, jobs, args)
		}
		return err
	})
	return res, err
}

// wrapHandler wraps a Consume handler in the queue's consume middleware
// (WithConsumeMiddleware), which New checked.
func (q *DelayQueue) wrapHandler(h Handler) Handler {
	for i := len(q.opts.consumeMiddleware) - 1; i >= 0; i-- {
		h = q.opts.consumeMiddleware[i](h)
	}
	return h
}
