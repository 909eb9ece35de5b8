package delayqueue

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// The pool is each bucket's hash of job ID -> encoded job. A job exists
// exactly while its ID is in the pool; its state is part of the encoding.

// Get returns the job with the given ID as it is now, with its State and
// Attempts. RunAt is a delayed or ready job's due time and a dead job's time
// of death; a reserved job has ReservedUntil instead. Get returns
// ErrNotFound when no such job exists and ErrInvalidID for an ID no job can
// have.
func (q *DelayQueue) Get(ctx context.Context, id string) (*Job, error) {
	b, err := q.openBucketOfID(id)
	if err != nil {
		return nil, err
	}
	// A delayed job's due time is its score in the bucket (lib/codec.lua): a
	// read-only script reads both at once, and runs at maxmemory.
	bk := q.keys.bucket(b)
	reply, err := q.run(ctx, b, scriptGet, []string{bk.pool, bk.zset}, id).Slice()
	if err != nil {
		return nil, fmt.Errorf("delayqueue: get %q: %w", id, err)
	}
	if len(reply) == 0 {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	v, ok := reply[0].(string)
	score, _ := reply[1].(string)
	if !ok || len(reply) != 2 {
		return nil, fmt.Errorf("delayqueue: get %q: unexpected reply %v", id, reply)
	}
	job, err := decodeJob(id, []byte(v))
	if err != nil {
		return nil, err
	}
	q.read(job)
	// The reservation is the popper's: a job from Get cannot Retry, Touch
	// or Release it.
	job.reservation = 0
	if due, err := strconv.ParseFloat(score, 64); err == nil && job.State == StateDelayed {
		job.RunAt = time.UnixMilli(int64(due))
	}
	return job, nil
}

// Remove cancels a job in any state: it will not be delivered (again). It
// returns ErrNotFound when no such job exists. A reserved job's consumer is
// not stopped (docs/guarantees.md); work that must not run after a
// cancellation needs its own check (docs/patterns.md, pay versus cancel).
// A reserved job's slot under a concurrency limit is free when it returns.
func (q *DelayQueue) Remove(ctx context.Context, id string) error {
	b, err := q.openBucketOfID(id)
	if err != nil {
		return err
	}
	bk := q.keys.bucket(b)
	res, err := q.run(ctx, b, scriptRemove, []string{bk.pool, bk.zset, bk.deadPrefix, bk.dedup, bk.deadTopics, bk.counts, bk.grants}, id).Slice()
	status, err := q.endedReservation(ctx, res, err)
	if err != nil {
		return fmt.Errorf("delayqueue: remove %q: %w", id, err)
	}
	if status == removeNoJob {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	q.held.settled(id, 0)
	return nil
}

// endedReservation reads the reply of a script that may end a job's
// reservation, whoever holds it (remove.lua, upsert.lua): its status and,
// after it, the topic and grant of the reserved job it ended, which it
// gives back for whichever process reserved the job.
func (q *DelayQueue) endedReservation(ctx context.Context, res []any, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	if len(res) != 1 && len(res) != 3 {
		return 0, fmt.Errorf("unexpected reply %v", res)
	}
	status, ok := res[0].(int64)
	if !ok {
		return 0, fmt.Errorf("unexpected reply %v", res)
	}
	if len(res) == 3 {
		topic, _ := res[1].(string)
		grant, _ := res[2].(string)
		q.giveBackGrant(ctx, topic, grant)
	}
	return status, nil
}

// read notes that job, decoded from this queue, had its ID made here
// when the queue generated it: pushed again, it is the same job; into
// another queue, it is refused (prepare).
func (q *DelayQueue) read(job *Job) {
	if job.nonce != 0 {
		job.madeBy = q.ident
	}
}

// openBucketOfID checks that the queue is open and the ID valid, and
// returns the ID's bucket.
func (q *DelayQueue) openBucketOfID(id string) (int, error) {
	if q.closed.Load() {
		return 0, ErrClosed
	}
	return bucketOfID(id, q.opts.buckets)
}
