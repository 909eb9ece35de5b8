package delayqueue

import (
	"context"
	"fmt"
	"time"

	"github.com/dqueue/delayqueue/internal/batch"
	"github.com/redis/go-redis/v9"
)

// Finish marks a reserved job done and deletes it. For a job this
// DelayQueue popped, it checks that reservation: once that ran out and the
// job went to another consumer, Finish changes nothing and returns
// ErrReservationLost. It returns ErrNotFound when no such job exists
// (including a re-sent Finish that took effect) and ErrNotReserved when the
// job is not reserved. Whichever process calls it, the job's slot under a
// concurrency limit is free when it returns.
func (q *DelayQueue) Finish(ctx context.Context, id string) error {
	if q.closed.Load() {
		return ErrClosed
	}
	var reservation any = ""
	held := q.held.get(id)
	if held.reservation != 0 {
		reservation = held.reservation
	}
	err := q.finishWithin(ctx, id, reservation, held.topic, held.grant != "", 0, 0)
	q.settledGrant(ctx, held.topic, held.grant, err)
	if err != nil {
		return err
	}
	q.held.settled(id, held.reservation)
	return nil
}

// finishCall is one job to finish.
type finishCall struct {
	b           int
	id          string
	reservation any  // "" for any reservation
	granted     bool // the caller holds the job's grant
	status      int64
	// The grant of a job finished for any reservation, and its topic,
	// as recorded beside the job (scripts/lib/grants.lua).
	grantTopic, grant string
}

// finishWithin deletes a reserved job; with a reservation, only while that
// reservation holds, so that a consumer whose reservation ran out leaves
// the job to the consumer that has it now. granted says that the caller
// holds the job's grant, which it gives back itself; finished for any
// reservation, the job's recorded grant is given back here. It works on a
// closed queue, so that Consume can settle the jobs its handlers finish
// after Close. Concurrent calls share script calls: one per bucket. A
// finish that would go alone waits up to within, or until enough finishes
// are queued, for others to share its script call. topic, when known, is
// reported to the Observer.
func (q *DelayQueue) finishWithin(ctx context.Context, id string, reservation any, topic string, granted bool, within time.Duration, enough int) error {
	b, err := bucketOfID(id, q.opts.buckets)
	if err != nil {
		return err
	}
	c := &finishCall{b: b, id: id, reservation: reservation, granted: granted}
	if err := q.finishes.For(b).DoWithin(ctx, c, within, enough); err != nil {
		return fmt.Errorf("delayqueue: finish %q: %w", id, err)
	}
	if c.grant != "" {
		q.giveBackGrant(ctx, c.grantTopic, c.grant)
	}
	return q.finished(ctx, id, topic, c.status)
}

// finished reads finish.lua's status for job id of topic.
func (q *DelayQueue) finished(ctx context.Context, id, topic string, status int64) error {
	switch status {
	case finishNoJob:
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	case finishNotReserved:
		return fmt.Errorf("%w: %q", ErrNotReserved, id)
	case finishLost:
		return fmt.Errorf("%w: %q", ErrReservationLost, id)
	}
	q.observe(ctx, Event{Kind: EventFinished, Topic: topic, JobID: id})
	return nil
}

// finishKeys are finish.lua's keys in the bucket.
func (bk bucketKeys) finishKeys() []string {
	return []string{bk.pool, bk.zset, bk.dedup, bk.counts, bk.grants}
}

// finishLanes coalesce concurrent finishes, one batch in flight, as
// reserves do.
func (q *DelayQueue) finishLanes(n int) batch.Lanes[*finishCall] {
	return batch.NewLanes(n, maxPipelinedCalls, 1, q.flushFinishes)
}

// flushFinishes finishes a batch of coalesced finish calls: one script call
// per bucket, all in one pipeline.
func (q *DelayQueue) flushFinishes(ctx context.Context, reqs []*batch.Request[*finishCall]) {
	groups := batch.GroupBy(reqs,
		func(c *finishCall) int { return c.b },
		func(*finishCall) int { return 1 }, maxPipelinedCalls)
	calls := make([]*scriptCall, len(groups))
	for i, g := range groups {
		calls[i] = &scriptCall{script: scriptFinish, keys: q.keys.bucket(g.Key).finishKeys(), args: finishCalls(g.Reqs)}
	}
	q.sendCalls(ctx, calls)
	for i, g := range groups {
		err := finishReplies(calls[i].cmd, g.Reqs)
		for _, r := range g.Reqs {
			r.Err = err
		}
	}
}

// finishReplies reads finish.lua's reply for reqs: one status each, then
// the grants of the jobs finished for any reservation.
func finishReplies(cmd *redis.Cmd, reqs []*batch.Request[*finishCall]) error {
	res, err := cmd.Slice()
	if err != nil {
		return err
	}
	n := len(reqs)
	if len(res) < n || (len(res)-n)%3 != 0 {
		return fmt.Errorf("unexpected reply %v for %d jobs", res, n)
	}
	for j, r := range reqs {
		s, ok := res[j].(int64)
		if !ok {
			return fmt.Errorf("unexpected reply %v", res)
		}
		r.In.status = s
	}
	for k := n; k < len(res); k += 3 {
		j, ok1 := res[k].(int64)
		topic, ok2 := res[k+1].(string)
		grant, ok3 := res[k+2].(string)
		if !ok1 || !ok2 || !ok3 || j < 1 || j > int64(n) {
			return fmt.Errorf("unexpected reply %v", res)
		}
		reqs[j-1].In.grantTopic, reqs[j-1].In.grant = topic, grant
	}
	return nil
}

// Release gives a popped job back to its ready list at once, for another
// consumer, without counting the attempt: for a consumer that stops before
// it could work on the job. It returns ErrReservationLost when job's reservation
// is gone and ErrNotFound when the job was removed.
func (q *DelayQueue) Release(ctx context.Context, job *Job) error {
	if q.closed.Load() {
		return ErrClosed
	}
	return q.release(ctx, job)
}

// release is Release on a queue that may be closed (see finish).
func (q *DelayQueue) release(ctx context.Context, job *Job) error {
	b, err := q.reservedBucket(job)
	if err != nil {
		return err
	}
	bk := q.keys.bucket(b)
	r, err := q.run(ctx, b, scriptRelease, []string{bk.pool, bk.zset, bk.readyPrefix, bk.counts, bk.sigPrefix},
		job.ID, job.reservation).Int64()
	if err != nil {
		return fmt.Errorf("delayqueue: release %q: %w", job.ID, err)
	}
	err = reservationResult(job.ID, []int64{r})
	q.settledGrant(ctx, job.Topic, job.grant, err)
	if err != nil {
		return err
	}
	q.held.settled(job.ID, job.reservation)
	return nil
}

// reservedBucket checks a job handed back by a consumer: one that this
// queue's Pop returned, for a reservation number means nothing in another
// queue.
func (q *DelayQueue) reservedBucket(job *Job) (int, error) {
	switch {
	case job == nil:
		return 0, fmt.Errorf("%w: nil", ErrInvalidJob)
	case job.reservation == 0:
		return 0, fmt.Errorf("%w: job %q was not returned by Pop", ErrInvalidJob, job.ID)
	case job.queue != q.ident:
		return 0, fmt.Errorf("%w: job %q was popped from another queue than %q", ErrInvalidJob, job.ID, q.opts.name)
	}
	return bucketOfID(job.ID, q.opts.buckets)
}

// reservationResult reads the status that the reservation-checked scripts
// return first.
func reservationResult(id string, res []int64) error {
	switch {
	case len(res) == 0:
		return fmt.Errorf("delayqueue: job %q: empty reply", id)
	case res[0] == heldNoJob:
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	case res[0] == heldLost:
		return fmt.Errorf("%w: %q", ErrReservationLost, id)
	}
	return nil
}
