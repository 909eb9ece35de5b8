package delayqueue

import (
	"context"
	"fmt"
	"time"

	"github.com/dqueue/delayqueue/internal/batch"
	"github.com/redis/go-redis/v9"
)

// Each bucket keeps one ready list per topic. A consumer of a topic pops from
// the lists of every bucket, but only from those that may hold something:
// whatever makes jobs ready publishes the bucket and how many, and the
// consumers of a process look at a bucket for no more jobs than they were
// told of (see topicWatch). An idle consumer therefore sends Redis nothing
// but a safety poll, and n new jobs wake n consumers and cost n looks at
// most, not one per consumer.

// staleSkips bounds how many stale IDs one reserve call drops.
const staleSkips = 100

// maxReserve bounds how many jobs one reserve call reserves: a script
// unpacks two values per job, and Redis's Lua unpacks at most 8,000.
const maxReserve = 256

// reserveStatus says how a reserve call ended.
type reserveStatus int

const (
	filled    reserveStatus = iota // it got every job it asked for
	listEmpty                      // it emptied the list
	onlyStale                      // it dropped staleSkips stale IDs; the list may hold more
)

// reserveCall is one Pop's look at one bucket's ready list.
type reserveCall struct {
	b      int
	topic  string
	want   int
	jobs   []*Job
	status reserveStatus
}

// reserve pops and reserves up to want ready jobs of topic from bucket b,
// with why it got fewer. Pops that look at the same list at the same time
// share one script call.
func (q *DelayQueue) reserve(ctx context.Context, b int, topic string, want int) ([]*Job, reserveStatus, error) {
	c := &reserveCall{b: b, topic: topic, want: want}
	if err := q.reserves.For(b).Do(ctx, c); err != nil {
		return nil, 0, err
	}
	return c.jobs, c.status, nil
}

// reserveLanes coalesce concurrent reserves, one batch in flight: more of a
// busy consumer's reserves wait and go together, in fewer script calls.
func (q *DelayQueue) reserveLanes(n int) batch.Lanes[*reserveCall] {
	return batch.NewLanes(n, maxPipelinedCalls, 1, q.flushReserves)
}

// flushReserves reserves jobs for a batch of coalesced reserve calls: one
// script call per list, all in one pipeline.
func (q *DelayQueue) flushReserves(ctx context.Context, reqs []*batch.Request[*reserveCall]) {
	type list struct {
		b     int
		topic string
	}
	// One call per list, or more when the requests want more than
	// maxReserve jobs together (each wants at most maxReserve).
	groups := batch.GroupBy(reqs,
		func(c *reserveCall) list { return list{c.b, c.topic} },
		func(c *reserveCall) int { return c.want }, maxReserve)
	calls := make([]*scriptCall, len(groups))
	for i, g := range groups {
		bk := q.keys.bucket(g.Key.b)
		calls[i] = &scriptCall{script: scriptReserve,
			keys:    []string{bk.ready(g.Key.topic), bk.pool, bk.zset, bk.reservations, bk.record(q.callName()), bk.counts},
			args:    []any{bk.wake, q.pub, staleSkips, g.Key.topic, g.Size, q.recordLife.Milliseconds()},
			settles: true, bucket: g.Key.b}
	}
	q.sendCalls(ctx, calls)
	// A call whose reply was lost may have reserved jobs that nobody
	// would receive before their TTR: it is sent again, and its second
	// run answers from its record.
	q.resendUnanswered(ctx, calls, resendWindow)
	for i, g := range groups {
		jobs, status, err := reserveResult(calls[i].cmd)
		if err != nil {
			err = fmt.Errorf("delayqueue: pop %q from bucket %d: %w", g.Key.topic, g.Key.b, err)
		} else if len(jobs) > 0 {
			// The reply is in: go-redis sends the call no more, and its
			// record can go.
			q.forget(g.Key.b, calls[i].keys[4])
		}
		for _, job := range jobs {
			job.queue = q.ident
		}
		for _, r := range g.Reqs {
			n := min(r.In.want, len(jobs))
			r.In.jobs, jobs = jobs[:n:n], jobs[n:]
			r.In.status, r.Err = status, err
		}
	}
}

// reserveResult reads reserve.lua's reply: the jobs reserved, and how the
// call ended.
func reserveResult(cmd *redis.Cmd) ([]*Job, reserveStatus, error) {
	res, err := cmd.Slice()
	if err != nil {
		return nil, 0, err
	}
	if len(res)%3 != 1 {
		return nil, 0, fmt.Errorf("unexpected reply %v", res)
	}
	var status reserveStatus
	switch res[0] {
	case int64(1):
		status = filled
	case int64(0):
		status = listEmpty
	case int64(2):
		status = onlyStale
	default:
		return nil, 0, fmt.Errorf("unexpected status %v", res[0])
	}
	var jobs []*Job
	for i := 1; i < len(res); i += 3 {
		id, _ := res[i].(string)
		v, _ := res[i+1].(string)
		job, err := decodeJob(id, []byte(v))
		if err != nil {
			return nil, 0, err
		}
		if due, _ := res[i+2].(int64); due > 0 {
			job.dueAt = time.UnixMilli(due)
		}
		jobs = append(jobs, job)
	}
	return jobs, status, nil
}

// Pop reserves a ready job of topic, waiting up to timeout for one to become
// ready: the oldest of the bucket it looks at, the buckets taken in turn (so
// jobs come out in the order they became ready within a bucket, and roughly so
// across buckets); a timeout of zero or less looks once without waiting. The job
// is reserved for its TTR: Finish it before then, or it is delivered again. Pop
// returns ErrNoJob when no job became ready in time, ctx.Err() when ctx ends,
// ErrClosed when the queue is closed, and ErrInvalidTopic for a bad topic. While
// it waits it sends Redis nothing: it is woken by the bucket handler that makes
// a job ready, in whichever process. Jobs pushed with a delay become ready only
// while at least one process has called Start: a process that waits in Pop
// on a queue whose buckets have had no handler for a safety poll or more
// logs a warning saying so. Finish checks the reservation Pop returns (see
// Finish). It is safe for concurrent use.
func (q *DelayQueue) Pop(ctx context.Context, topic string, timeout time.Duration) (*Job, error) {
	sent := time.Now()
	jobs, err := q.pop(ctx, topic, 1, timeout)
	if err != nil {
		return nil, err
	}
	// Finish(ctx, id) checks this reservation (see held.go). A look that
	// found the job was sent after sent: the reservation ends later than
	// sent plus the TTR.
	q.held.add(jobs, sent)
	return jobs[0], nil
}

// pop reserves from 1 to want ready jobs of topic, as Pop does one.
func (q *DelayQueue) pop(ctx context.Context, topic string, want int, timeout time.Duration) ([]*Job, error) {
	if q.closed.Load() {
		return nil, ErrClosed
	}
	if err := validateTopic(topic); err != nil {
		return nil, err
	}
	n, err := q.notifier(ctx)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(timeout)
	// A Pop that does not wait looks at every bucket: a notification for a
	// job pushed just before may still be on its way.
	all := timeout <= 0
	// The first Pop of a topic sends the subscription to its channels; no
	// Pop waits for it. Redis's confirmation makes the waiting Pops look
	// again, covering whatever became ready before it.
	w, err := n.watch(topic)
	if err != nil {
		return nil, err
	}
	var timer *time.Timer
	wt := newWaiter()
	defer w.leave(wt)
	for {
		paused, err := q.isPaused(ctx, topic)
		if err != nil {
			return nil, err
		}
		buckets := w.candidates(int(q.rotor.Add(1)%uint32(q.opts.buckets)), all, wt)
		if paused {
			buckets = nil // enlisted as a waiter, so that a resume wakes it
		}
		again := false
		var got []*Job
		for _, b := range buckets {
			l := w.take(b, min(want-len(got), maxReserve), all)
			if l.n == 0 {
				continue // another Pop of this process looks at what it has
			}
			jobs, status, err := q.reserve(ctx, b, topic, l.n)
			w.settle(l, len(jobs), status, err)
			q.observeReserved(ctx, jobs)
			got = append(got, jobs...)
			switch {
			case err != nil && len(got) > 0:
				// The jobs are reserved and the caller owns them; the
				// error is logged here and met again on its next pop.
				q.opts.logger.Warn("delayqueue: cannot pop from a bucket; returning the jobs reserved so far",
					attrTopic, topic, attrBucket, b, attrError, err)
				return got, nil
			case err != nil:
				return nil, err
			case len(got) == want:
				return got, nil
			case status == onlyStale:
				again = true
			}
		}
		if len(got) > 0 {
			return got, nil
		}
		if again {
			continue
		}
		remaining := time.Until(deadline)
		if remaining <= 0 {
			return nil, ErrNoJob
		}
		wait := min(remaining, q.opts.poll)
		if paused {
			wait = min(wait, pauseRefresh)
		}
		if timer == nil {
			timer = time.NewTimer(wait)
			defer timer.Stop()
		} else {
			timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-q.done:
			return nil, ErrClosed
		case <-wt.wake:
		case <-timer.C:
			// The safety poll: once per poll of the topic in this
			// process, whoever's timer fires (Consume's and short Pops'
			// timers never outlast a poll).
			w.pollDue(q.opts.poll)
			q.checkStarted(ctx)
		}
	}
}
