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
	role leaseRole // what the call made of the caller: holder, standby, second standby or none
	// moved is how many due jobs the holder moved.
	moved int
	// next is how long until the bucket's next job is due; -1 when the
	// bucket is empty, or not known (to neither holder nor standby). For
	// the standby, how long until it could take the bucket over: the next
	// job overdue by takeoverGrace, and the holder silent as long. For the
	// second standby, how long until it looks whether the standby is late.
	next time.Duration
	// wait is, for the standby, how long the holder's lease has to run;
	// for none, the second standby's.
	wait time.Duration
	// fresh is set when the call took a free lease or the bucket over,
	// rather than extending its own.
	fresh bool
	// vacated is set when the call freed a standby lease: the standby
	// took the bucket over, the second standby took the standby's place,
	// or the holder found either silent (move.lua). The others hear of it
	// from the caller.
	vacated bool
	// sooner is set, for the standby, when the second standby planned its
	// next look for a later look of the standby's than the one just
	// planned: the caller tells it to look sooner.
	sooner bool
	// ready counts the jobs that became ready, per topic.
	ready []topicCount
	// signaled are the topics looked at for a lost signal (moveDue's
	// stranded) whose waiting job got one.
	signaled []string
}

type topicCount struct {
	topic string
	count int
}

// moveDue moves up to a batch of due jobs of bucket b to their ready lists
// (or dead letters), holding or taking the bucket's lease with token, or
// standing by (lock.go); with trim, it also deletes the tombstones whose
// dedup window ended. A holder, and a standby, also give a signal to the
// job that heads the ready list of each topic of stranded (everyTopic: of
// each with ready jobs), when it has waited over a second with none left,
// or to a list whose first 8 entries are traces while the counts say it
// holds ready jobs (move.lua).
func (q *DelayQueue) moveDue(ctx context.Context, b int, token string, trim bool, stranded ...string) (moveResult, error) {
	bk := q.keys.bucket(b)
	keys := []string{bk.zset, bk.pool, bk.readyPrefix, bk.deadPrefix, bk.lock, bk.deadTopics, bk.dedup, bk.counts, bk.sigPrefix, bk.standby, bk.watched, bk.second}
	args := []any{token, q.opts.lease.Milliseconds(), q.opts.batch, trim, takeoverGrace.Milliseconds()}
	for _, topic := range stranded {
		args = append(args, topic)
	}
	reply, err := q.run(ctx, b, scriptMove, keys, args...).Slice()
	if err != nil {
		return moveResult{}, fmt.Errorf("delayqueue: move bucket %d: %w", b, err)
	}
	bad := func() (moveResult, error) {
		return moveResult{}, fmt.Errorf("delayqueue: move bucket %d: unexpected reply %v", b, reply)
	}
	var head [3]int64
	for i := range head {
		if i >= len(reply) {
			if head[0] == moveNeither && i == 2 {
				break // {-1, ttl}
			}
			return bad()
		}
		var ok bool
		if head[i], ok = reply[i].(int64); !ok {
			return bad()
		}
	}
	until := func(us int64) time.Duration {
		if us < 0 {
			return -1
		}
		return time.Duration(us) * time.Microsecond
	}
	switch head[0] {
	case moveNeither:
		return moveResult{role: roleNone, next: -1, wait: time.Duration(max(head[1], 0)) * time.Millisecond}, nil
	case moveStandby:
		if len(reply) < 4 {
			return bad()
		}
		flags, _ := reply[3].(int64)
		return moveResult{role: roleStandby, next: until(head[1]), wait: time.Duration(max(head[2], 0)) * time.Millisecond,
			vacated: flags&moveVacated != 0, sooner: flags&moveSooner != 0}, nil
	case moveSecond:
		return moveResult{role: roleSecond, next: until(head[1])}, nil
	}
	if head[0] < 0 || len(reply)%2 == 0 {
		return bad()
	}
	r := moveResult{role: roleHolder, moved: int(head[0]), next: until(head[1]), fresh: head[2]&moveFresh != 0, vacated: head[2]&moveVacated != 0}
	for i := 3; i+1 < len(reply); i += 2 {
		topic, _ := reply[i].(string)
		count, _ := reply[i+1].(int64)
		if count == 0 {
			r.signaled = append(r.signaled, topic)
			continue
		}
		r.ready = append(r.ready, topicCount{topic, int(count)})
	}
	return r, nil
}

// RescheduleIn moves a delayed or ready job to be due after delay from now,
// on the server's clock; zero makes it ready now. It returns ErrNotPending
// for a reserved or dead job, ErrNotFound when no such job exists, and
// ErrInvalidJob for a negative delay.
func (q *DelayQueue) RescheduleIn(ctx context.Context, id string, delay time.Duration) error {
	return q.reschedule(ctx, id, delay, time.Time{})
}

// RescheduleAt moves a delayed or ready job to be due at t; a t in the past
// makes it ready now. It returns ErrNotPending for a reserved or dead job,
// ErrNotFound when no such job exists, and ErrInvalidJob for a zero t or
// one past August 10889.
func (q *DelayQueue) RescheduleAt(ctx context.Context, id string, t time.Time) error {
	if t.IsZero() {
		return fmt.Errorf("%w: zero time", ErrInvalidJob)
	}
	return q.reschedule(ctx, id, 0, t)
}

// reschedule moves a delayed or ready job to a new due time: after delay
// from now, or at runAt when it is not zero.
func (q *DelayQueue) reschedule(ctx context.Context, id string, delay time.Duration, runAt time.Time) error {
	b, err := q.openBucketOfID(id)
	if err != nil {
		return err
	}
	if delay < 0 {
		return fmt.Errorf("%w: negative delay %v", ErrInvalidJob, delay)
	}
	delayMs, dueMs := ceilMs(delay), int64(0)
	if !runAt.IsZero() {
		if dueMs, err = runAtMs(runAt); err != nil {
			return err
		}
		delayMs = -1
	}
	bk := q.keys.bucket(b)
	res, err := q.run(ctx, b, scriptReschedule, []string{bk.pool, bk.zset, bk.readyPrefix, bk.counts, bk.sigPrefix},
		id, delayMs, dueMs, bk.wake, q.pub).Int64Slice()
	if err != nil {
		return fmt.Errorf("delayqueue: reschedule %q: %w", id, err)
	}
	switch res[0] {
	case rescheduleNoJob:
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	case rescheduleNotPending:
		return fmt.Errorf("%w: %q", ErrNotPending, id)
	}
	return nil
}
