package delayqueue

import (
	"context"
	"errors"
	"fmt"
)

// Hand-on: a job of a topic with a concurrency limit (and no rate) whose
// handler succeeded passes its grant on to the next job in the round trip
// that finishes it. One pipeline carries the finish, a reservation of one
// job of the topic from the same bucket, and the grant's renewal. The
// reservation waits for nothing, and nothing is counted twice: it is in
// the finished job's slot (on a Cluster, on its master, after the finish in
// the same connection), and reserve.lua takes nothing while the finished
// job is still reserved (the finish did not run first). The grant is
// never free between the two jobs, and a renewal refused (a Rate added, or
// limits lowered since) releases the new job before the grant goes back.

// finishHandOn finishes job, whose handler succeeded, and reserves the next
// job of its topic with its grant, in one round trip. It returns the next
// job, bound to the grant, or nil; then the grant went on as settledGrant
// sends it. err is the finish's, as finish returns it.
func (q *DelayQueue) finishHandOn(ctx context.Context, job *Job) (next *Job, err error) {
	b, err := q.reservedBucket(job)
	if err != nil {
		return nil, err
	}
	w, err := q.waiting()
	if err != nil {
		return nil, err
	}
	bk := q.keys.bucket(b)
	fin := &scriptCall{script: scriptFinish, keys: bk.finishKeys(), args: []any{job.ID, job.reservation}, settles: true, bucket: b}
	res := q.reserveCall(b, job.Topic, 1, 0, true, job.ID, job.reservation)
	calls := []*scriptCall{fin, res, q.renewCall(job.Topic, job.grant)}
	q.sendCalls(ctx, calls)
	q.resendUnanswered(ctx, calls[1:2], resendWindow)

	status, err := fin.cmd.Int64Slice()
	switch {
	case err == nil && len(status) != 1:
		err = fmt.Errorf("delayqueue: finish %q: unexpected reply %v", job.ID, status)
	case err == nil:
		err = q.finished(ctx, job.ID, job.Topic, status[0])
	default:
		err = fmt.Errorf("delayqueue: finish %q: %w", job.ID, err)
	}
	var jobs []*Job
	if got, st, left, rerr := q.reserved(ctx, b, job.Topic, res); rerr == nil {
		w.settle(job.Topic, b, left, st)
		q.observeReserved(ctx, got)
		jobs = got
	}
	if len(jobs) == 0 {
		// No job in the bucket, or the finish's outcome is not known: the
		// grant goes on as any settled job's.
		q.settledGrant(ctx, job.Topic, job.grant, err)
		return nil, err
	}
	// The reserve ran after the job was no longer reserved: whatever the
	// finish's reply said, the grant is free for the new job.
	g := &grant{topic: job.Topic, handed: job.grant, n: 1}
	if rerr := g.renewed(calls[2].cmd); rerr != nil {
		q.unrenewed(ctx, g, rerr, jobs)
		return nil, err
	}
	q.bind(ctx, g, jobs)
	return jobs[0], err
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
