package delayqueue

import (
	"context"
	"fmt"
	"time"
)

// A bucket is one shard of the queue: a pool hash, a zset of job IDs scored
// by due time (and of reserved jobs, scored by reservation deadline), and ready
// lists per topic, all under one hash tag. Every change to a bucket is one
// script over its keys.

// moveResult is what one move step did.
type moveResult struct {
	moved int
	// next is how long until the bucket's next job is due; -1 when the
	// bucket is empty.
	next time.Duration
	// held is how long another process still holds the lease; zero when
	// this call held it.
	held time.Duration
	// contended is true when another process holds the lease.
	contended bool
	// mark is the mark of the script's run, which its ready wake-ups carry.
	mark string
	// fresh is set when the call took a free lease rather than extending
	// its own.
	fresh bool
	// ready counts the jobs that became ready, per topic.
	ready []topicCount
}

type topicCount struct {
	topic string
	count int
}

// moveDue moves up to a batch of due jobs of bucket b to their ready lists
// (or dead letters), holding or taking the bucket's lease with token. call
// numbers the call, for the mark of its wake-ups; with trim, it also
// deletes the tombstones whose dedup window ended.
func (q *DelayQueue) moveDue(ctx context.Context, b int, token string, call uint64, trim bool) (moveResult, error) {
	bk := q.keys.bucket(b)
	keys := []string{bk.zset, bk.pool, bk.readyPrefix, bk.deadPrefix, bk.lock, bk.deadTopics, bk.dedup, bk.counts}
	reply, err := q.run(ctx, b, scriptMove, keys,
		token, q.opts.lease.Milliseconds(), q.opts.batch, bk.readyChannels, q.pub, call, trim).Slice()
	if err != nil {
		return moveResult{}, fmt.Errorf("delayqueue: move bucket %d: %w", b, err)
	}
	var res [2]int64
	ok := len(reply) >= 2
	for i := 0; ok && i < 2; i++ {
		res[i], ok = reply[i].(int64)
	}
	if ok && res[0] < 0 {
		return moveResult{contended: true, held: time.Duration(max(res[1], 0)) * time.Millisecond}, nil
	}
	r := moveResult{moved: int(res[0]), next: -1}
	var fresh int64
	if ok = ok && len(reply)%2 == 0; ok {
		r.mark, ok = reply[2].(string)
	}
	if ok {
		fresh, ok = reply[3].(int64)
	}
	if !ok {
		return moveResult{}, fmt.Errorf("delayqueue: move bucket %d: unexpected reply %v", b, reply)
	}
	r.fresh = fresh == 1
	if res[1] >= 0 {
		r.next = time.Duration(res[1]) * time.Microsecond
	}
	for i := 4; i+1 < len(reply); i += 2 {
		topic, _ := reply[i].(string)
		count, _ := reply[i+1].(int64)
		r.ready = append(r.ready, topicCount{topic, int(count)})
	}
	return r, nil
}

// RescheduleIn moves a delayed or ready job to be due after delay from now,
// on the server's clock; zero makes it ready now. It returns ErrNotPending
// for a reserved or dead job, ErrNotFound when no such job exists, and
// ErrInvalidJob for a negative delay.
func (q *DelayQueue) RescheduleIn(ctx context.Context, id string, delay time.Duration) error {
	return q.Reschedule(ctx, id, delay, time.Time{})
}

// RescheduleAt moves a delayed or ready job to be due at t; a t in the past
// makes it ready now. It returns ErrNotPending for a reserved or dead job,
// ErrNotFound when no such job exists, and ErrInvalidJob for a zero t or
// one past August 10889.
func (q *DelayQueue) RescheduleAt(ctx context.Context, id string, t time.Time) error {
	if t.IsZero() {
		return fmt.Errorf("%w: zero time", ErrInvalidJob)
	}
	return q.Reschedule(ctx, id, 0, t)
}

// Reschedule moves a delayed or ready job to a new due time: after delay
// from now, or at runAt when it is not zero. Giving both returns
// ErrInvalidJob, as Push does.
//
// Deprecated: use RescheduleIn or RescheduleAt, which cannot be given two
// times.
func (q *DelayQueue) Reschedule(ctx context.Context, id string, delay time.Duration, runAt time.Time) error {
	b, err := q.openBucketOfID(id)
	if err != nil {
		return err
	}
	if delay < 0 {
		return fmt.Errorf("%w: negative delay %v", ErrInvalidJob, delay)
	}
	if delay > 0 && !runAt.IsZero() {
		return fmt.Errorf("%w: both a delay and a time", ErrInvalidJob)
	}
	delayMs, dueMs := ceilMs(delay), int64(0)
	if !runAt.IsZero() {
		if dueMs, err = runAtMs(runAt); err != nil {
			return err
		}
		delayMs = -1
	}
	bk := q.keys.bucket(b)
	res, err := q.run(ctx, b, scriptReschedule, []string{bk.pool, bk.zset, bk.readyPrefix, bk.counts},
		id, delayMs, dueMs, bk.wake, bk.readyChannels, q.pub).Int64Slice()
	if err != nil {
		return fmt.Errorf("delayqueue: reschedule %q: %w", id, err)
	}
	switch res[0] {
	case 0:
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	case -1:
		return fmt.Errorf("%w: %q", ErrNotPending, id)
	}
	return nil
}
