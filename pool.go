package delayqueue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// The pool is each bucket's hash of job ID -> encoded job. A job exists
// exactly while its ID is in the pool; its state is part of the encoding.

// Get returns the job with the given ID as it is now, with its State and
// Attempts. It returns ErrNotFound when no such job exists (it was finished,
// removed, or never pushed) and ErrInvalidID for an ID no job can have.
func (q *DelayQueue) Get(ctx context.Context, id string) (*Job, error) {
	b, err := q.openBucketOfID(id)
	if err != nil {
		return nil, err
	}
	// A delayed job's due time is its score in the bucket (job.lua): read
	// both at once.
	bk := q.keys.bucket(b)
	var value *redis.StringCmd
	var score *redis.FloatCmd
	_, err = q.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		value = p.HGet(ctx, bk.pool, id)
		score = p.ZScore(ctx, bk.zset, id)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		q.noteError(ctx, err)
		return nil, fmt.Errorf("delayqueue: get %q: %w", id, err)
	}
	v, err := value.Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("delayqueue: get %q: %w", id, err)
	}
	job, err := decodeJob(id, v)
	if err != nil {
		return nil, err
	}
	// The reservation is the popper's: a job from Get cannot Retry, Touch
	// or Release it.
	job.lease = 0
	if due, err := score.Result(); err == nil && job.State == StateDelayed {
		job.RunAt = time.UnixMilli(int64(due))
	}
	return job, nil
}

// Finish marks a reserved job done and deletes it. When this DelayQueue
// popped the job, Finish checks that the reservation it popped still holds:
// once that ran out and the job went back to ready or to another consumer,
// Finish changes nothing and returns ErrLeaseLost, so a stale consumer
// cannot delete a job that another one now works on. A job this
// DelayQueue did not pop (popped by another process, or by this one more
// than an hour after that reservation ran out) is finished in whatever
// reservation it is now, as any process may. If the job was popped again
// by this DelayQueue, the latest reservation is the one checked. Finish
// returns ErrNotFound when no such job exists and ErrNotReserved when the
// job is not reserved. A Finish whose reply was lost and that the client
// re-sent returns ErrNotFound although the job was finished: treat
// ErrNotFound from Finish as "already gone".
func (q *DelayQueue) Finish(ctx context.Context, id string) error {
	if q.closed.Load() {
		return ErrClosed
	}
	var lease any = ""
	held := q.held.lease(id)
	if held != 0 {
		lease = held
	}
	if err := q.finish(ctx, id, lease); err != nil {
		return err
	}
	q.held.settled(id, held)
	return nil
}

// finishCall is one job to finish.
type finishCall struct {
	b      int
	id     string
	lease  any // "" for any reservation
	status int64
}

// finish deletes a reserved job; with a lease, only while that reservation
// holds, so that a consumer whose lease ran out leaves the job to the
// consumer that has it now. It works on a closed queue, so that Consume can
// settle the jobs its handlers finish after Close. Concurrent calls share
// script calls: one per bucket.
func (q *DelayQueue) finish(ctx context.Context, id string, lease any) error {
	b, err := bucketOfID(id, q.opts.buckets)
	if err != nil {
		return err
	}
	c := &finishCall{b: b, id: id, lease: lease}
	if err := lane(q.finishes, b).do(ctx, c); err != nil {
		return fmt.Errorf("delayqueue: finish %q: %w", id, err)
	}
	switch c.status {
	case 0:
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	case -1:
		return fmt.Errorf("%w: %q", ErrNotReserved, id)
	case -2:
		return fmt.Errorf("%w: %q", ErrLeaseLost, id)
	}
	return nil
}

// flushFinishes finishes a batch of coalesced finish calls: one script call
// per bucket, all in one pipeline.
func (q *DelayQueue) flushFinishes(ctx context.Context, batch []*request[*finishCall]) {
	groups := groupBatch(batch,
		func(c *finishCall) int { return c.b },
		func(*finishCall) int { return 1 }, maxPipelinedCalls)
	calls := make([]*scriptCall, len(groups))
	for i, g := range groups {
		bk := q.keys.bucket(g.key)
		args := make([]any, 0, 2*len(g.reqs))
		for _, r := range g.reqs {
			args = append(args, r.in.id, r.in.lease)
		}
		calls[i] = &scriptCall{script: scriptFinish, keys: []string{bk.pool, bk.zset, bk.dedup}, args: args, settles: true, bucket: g.key}
	}
	q.sendCalls(ctx, calls)
	for i, g := range groups {
		res, err := calls[i].cmd.Int64Slice()
		if err == nil && len(res) != len(g.reqs) {
			err = fmt.Errorf("%d replies for %d jobs", len(res), len(g.reqs))
		}
		for j, r := range g.reqs {
			if err != nil {
				r.err = err
			} else {
				r.in.status = res[j]
			}
		}
	}
}

// Remove cancels a job in any state: it will not be delivered (again). It
// costs O(log n). It returns ErrNotFound when no such job exists.
func (q *DelayQueue) Remove(ctx context.Context, id string) error {
	b, err := q.openBucketOfID(id)
	if err != nil {
		return err
	}
	bk := q.keys.bucket(b)
	r, err := q.run(ctx, b, scriptRemove, []string{bk.pool, bk.zset, bk.deadPrefix, bk.dedup, bk.deadTopics}, id).Int64()
	if err != nil {
		return fmt.Errorf("delayqueue: remove %q: %w", id, err)
	}
	if r == 0 {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	q.held.settled(id, 0)
	return nil
}

// openBucketOfID checks that the queue is open and the ID valid, and
// returns the ID's bucket.
func (q *DelayQueue) openBucketOfID(id string) (int, error) {
	if q.closed.Load() {
		return 0, ErrClosed
	}
	return bucketOfID(id, q.opts.buckets)
}

// bucketOfID checks an ID and returns its bucket.
func bucketOfID(id string, buckets int) (int, error) {
	if err := validateID(id); err != nil {
		return 0, err
	}
	return bucketOf(id, buckets), nil
}
