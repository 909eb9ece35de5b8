package delayqueue

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/dqueue/delayqueue/internal/batch"
)

// Hand-on: a job of a topic with a concurrency limit (and no rate) whose
// handler succeeded passes its grant on to the next job in the round trip
// that finishes it. One pipeline carries a reserve call that finishes the
// job and reserves one job of the topic from the same bucket, and the
// grant's renewal (for the hand-ons of a process at the same time: one
// reserve call per bucket, one renewal per topic). The reservation waits
// for nothing, and nothing is counted twice: reserve.lua finishes the jobs
// it carries before it reserves, in the same script, so the finished job
// is never still reserved when the next one is. The grant is never free
// between the two jobs, and a renewal refused (a Rate added, or limits
// lowered since) releases the new job before the grant goes back.

// handOnCall is one job whose grant goes on, and what became of it.
type handOnCall struct {
	job  *Job
	b    int
	next *Job  // reserved with the grant, bound to it
	err  error // the finish's
}

// finishHandOn finishes job, whose handler succeeded, and reserves the next
// job of its topic with its grant, in one round trip shared with the
// process's other hand-ons meanwhile. It returns the next job, bound to the
// grant, or nil; then the grant went on as settledGrant sends it. err is
// the finish's, as finish returns it.
func (q *DelayQueue) finishHandOn(ctx context.Context, job *Job) (next *Job, err error) {
	b, err := q.reservedBucket(job)
	if err != nil {
		return nil, err
	}
	c := &handOnCall{job: job, b: b}
	if err := q.handons.Do(ctx, c); err != nil {
		return nil, err
	}
	return c.next, c.err
}

// handOnLane coalesces the hand-ons of the process, two batches in flight.
func (q *DelayQueue) handOnLane() *batch.Lane[*handOnCall] {
	return batch.NewLane(maxPipelinedCalls, 2, q.flushHandOns)
}

// flushHandOns sends a batch of hand-ons in one pipeline: per bucket, one
// reserve call that finishes its jobs and reserves as many; per topic, one
// renewal of their grants.
func (q *DelayQueue) flushHandOns(ctx context.Context, reqs []*batch.Request[*handOnCall]) {
	w, err := q.waiting()
	if err != nil {
		for _, r := range reqs {
			r.Err = err
		}
		return
	}
	type list struct {
		b     int
		topic string
	}
	lists := batch.GroupBy(reqs, func(c *handOnCall) list { return list{c.b, c.job.Topic} },
		func(*handOnCall) int { return 1 }, maxReserve)
	topics := batch.GroupBy(reqs, func(c *handOnCall) string { return c.job.Topic },
		func(*handOnCall) int { return 1 }, maxPipelinedCalls)
	var ress, renews []*scriptCall
	resumes := make([]uint64, len(lists)) // before the calls: see settle
	for i, l := range lists {
		resumes[i] = w.resumed(l.Key.topic)
		var args []any
		var grants []string
		for _, r := range l.Reqs {
			args = append(args, r.In.job.ID, r.In.job.reservation, grantFlag(true))
			grants = append(grants, r.In.job.grant)
		}
		ress = append(ress, q.reserveCall(l.Key.b, l.Key.topic, len(l.Reqs), 0, reserveGreedy, args, 0, grants...))
	}
	for _, t := range topics {
		var grants []string
		for _, r := range t.Reqs {
			grants = append(grants, r.In.job.grant)
		}
		renews = append(renews, q.renewCall(t.Key, grants...))
	}
	q.sendCalls(ctx, slices.Concat(ress, renews))
	q.resendUnanswered(ctx, ress, resendWindow)
	q.answered(ress)

	renewed := map[*handOnCall]func(*grant) error{}
	for i, t := range topics {
		for j, r := range t.Reqs {
			renewed[r.In] = func(g *grant) error { return g.renewed(renews[i].cmd, j) }
		}
	}
	for i, l := range lists {
		status, ferr := reserveFinishes(ress[i])
		jobs, st, left, rerr := q.reserved(ctx, l.Key.b, l.Key.topic, ress[i])
		if rerr == nil {
			w.settle(l.Key.topic, l.Key.b, left, st, resumes[i])
			q.observeReserved(ctx, placed(jobs, nil))
		}
		for j, r := range l.Reqs {
			c := r.In
			if ferr != nil {
				c.err = fmt.Errorf("delayqueue: finish %q: %w", c.job.ID, ferr)
			} else {
				c.err = q.finished(ctx, c.job.ID, c.job.Topic, status[j])
			}
			if len(jobs) == 0 {
				// No job in the bucket, or the finish's outcome is not
				// known: the grant goes on as any settled job's.
				q.settledGrant(ctx, c.job.Topic, c.job.grant, c.err)
				continue
			}
			// The reserve ran after the job's finish, in the same
			// script: the grant is free for the new job when the finish
			// took effect. A job no longer held was settled elsewhere,
			// and whoever settled it may be giving its grant back
			// (scripts/lib/grants.lua): the new job goes back to ready.
			// A job settled elsewhere before the call's second run (nil)
			// took the grant with it.
			next := placed(jobs[:1], []string{c.job.grant})
			jobs = jobs[1:]
			g := &grant{topic: c.job.Topic, handed: c.job.grant, n: 1, counted: true}
			err := renewed[c](g)
			if err == nil && (c.err != nil || len(next) == 0) {
				err = errNotRenewed
			}
			if err != nil {
				q.unrenewed(ctx, g, err, next)
				continue
			}
			q.bind(ctx, g, next, 1)
			c.next = next[0]
		}
	}
}

// handsOn reports whether a job of topic with a grant, whose handler
// succeeded, may hand its grant on to the next job (finishHandOn): the
// topic has no Rate, as the last acquire said.
func (lm *limiter) handsOn(topic string) bool {
	lm.mu.Lock()
	defer lm.mu.Unlock()
	return lm.unrated[topic]
}

// settledOK reports whether err, from a settling call, says the job is
// no longer reserved by its caller: its grant is free.
func settledOK(err error) bool {
	return err == nil || errors.Is(err, ErrReservationLost) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrNotReserved)
}
