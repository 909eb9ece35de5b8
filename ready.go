package delayqueue

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

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
	if err := lane(q.reserves, b).do(ctx, c); err != nil {
		return nil, 0, err
	}
	return c.jobs, c.status, nil
}

// flushReserves reserves jobs for a batch of coalesced reserve calls: one
// script call per list, all in one pipeline.
func (q *DelayQueue) flushReserves(ctx context.Context, batch []*request[*reserveCall]) {
	type list struct {
		b     int
		topic string
	}
	// One call per list, or more when the requests want more than
	// maxReserve jobs together (each wants at most maxReserve).
	groups := groupBatch(batch,
		func(c *reserveCall) list { return list{c.b, c.topic} },
		func(c *reserveCall) int { return c.want }, maxReserve)
	calls := make([]*scriptCall, len(groups))
	for i, g := range groups {
		bk := q.keys.bucket(g.key.b)
		calls[i] = &scriptCall{script: scriptReserve,
			keys:    []string{bk.ready(g.key.topic), bk.pool, bk.zset, bk.leases, bk.record(q.callName())},
			args:    []any{bk.wake, q.pub, staleSkips, g.key.topic, g.size, q.recordLife.Milliseconds()},
			settles: true, bucket: g.key.b}
	}
	q.sendCalls(ctx, calls)
	for i, g := range groups {
		jobs, status, err := reserveResult(calls[i].cmd)
		if err != nil {
			err = fmt.Errorf("delayqueue: pop %q from bucket %d: %w", g.key.topic, g.key.b, err)
		} else if len(jobs) > 0 {
			// The reply is in: go-redis sends the call no more, and its
			// record can go.
			q.forget(g.key.b, calls[i].keys[4])
		}
		for _, r := range g.reqs {
			n := min(r.in.want, len(jobs))
			r.in.jobs, jobs = jobs[:n:n], jobs[n:]
			r.in.status, r.err = status, err
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
	if len(res)%2 != 1 {
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
	for i := 1; i < len(res); i += 2 {
		id, _ := res[i].(string)
		v, _ := res[i+1].(string)
		job, err := decodeJob(id, []byte(v))
		if err != nil {
			return nil, 0, err
		}
		jobs = append(jobs, job)
	}
	return jobs, status, nil
}

// Pop reserves a ready job of topic, waiting up to timeout for one to
// become ready: the oldest of the bucket it looks at, the buckets taken in
// turn (so jobs come out in the order they became ready within a bucket,
// and roughly so across buckets); a timeout of zero or less looks once without waiting. The
// job is reserved for its TTR: Finish it before then, or it is delivered
// again. Pop returns ErrNoJob when no job became ready in time, ctx.Err()
// when ctx ends, ErrClosed when the queue is closed, and ErrInvalidTopic for
// a bad topic. While it waits it sends Redis nothing: it is woken by the
// handler that makes a job ready, in whichever process; jobs pushed with a
// delay become ready only while some process has called Start. Finish
// checks the reservation Pop returns (see Finish). It is safe for
// concurrent use.
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
		buckets := w.candidates(int(q.rotor.Add(1)%uint32(q.opts.buckets)), all, wt)
		again := false
		var got []*Job
		for _, b := range buckets {
			l := w.take(b, min(want-len(got), maxReserve), all)
			if l.n == 0 {
				continue // another Pop of this process looks at what it has
			}
			jobs, status, err := q.reserve(ctx, b, topic, l.n)
			w.settle(l, len(jobs), status, err)
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
		}
	}
}

// topicWatch tracks, for one topic in this process, how many jobs each
// bucket's ready list holds as far as the notifications tell, and the Pops
// waiting for one. A notification that n jobs became ready in a bucket adds
// n to its count and wakes n waiting Pops, oldest first; a Pop takes from
// the count what it asks the bucket for (take), so that sixteen Pops do not
// all look at a list that got one job. A look that finds the list empty sets
// the count to zero, unless a notification came in the meantime. The count
// is unknown (every Pop may look) at first, after a safety poll, and when
// the pub/sub connection was re-established: notifications may have been
// lost.
type topicWatch struct {
	mu        sync.Mutex
	ready     []int    // per bucket: jobs ready and not taken by a look; unknown for "look"
	version   []uint64 // bumped on every notification of the bucket
	waiters   []*waiter
	rechecked time.Time // the last safety poll (or the watch's start)
}

// unknown is a bucket's ready count when a look must find it out.
const unknown = -1

// maxCount bounds a ready count: a notification of more is as good as
// unknown.
const maxCount = 1 << 30

// waiter is one Pop of the topic. It is in waiters from its look at the
// buckets until it is woken.
type waiter struct {
	wake chan struct{} // buffered; holds a wake-up not yet taken
	hint int           // the bucket it was woken for, looked at first; -1 for none
}

func newWaiter() *waiter { return &waiter{wake: make(chan struct{}, 1), hint: -1} }

func newTopicWatch(buckets int) *topicWatch {
	w := &topicWatch{ready: make([]int, buckets), version: make([]uint64, buckets), rechecked: time.Now()}
	for b := range w.ready {
		w.ready[b] = unknown
	}
	return w
}

// notify records that n jobs became ready in bucket b and wakes n waiters.
func (w *topicWatch) notify(b, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if b < 0 || b >= len(w.version) {
		return // from a queue opened with more buckets: ignored
	}
	w.version[b]++
	n = max(n, 1)
	switch {
	case w.ready[b] == unknown || w.ready[b]+n >= maxCount:
		w.ready[b] = unknown
	default:
		w.ready[b] += n
	}
	w.wakeLocked(n, b)
}

// pollDue rechecks every bucket when the last recheck was poll ago or
// more: a job whose notification was lost (a full client buffer, a script
// cut short) is found then, at the latest.
func (w *topicWatch) pollDue(poll time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if time.Since(w.rechecked) >= poll {
		w.recheckLocked()
	}
}

// recheckLocked makes every bucket's count unknown and wakes every waiter.
func (w *topicWatch) recheckLocked() {
	w.rechecked = time.Now()
	for b := range w.version {
		w.version[b]++
		w.ready[b] = unknown
	}
	w.wakeLocked(len(w.waiters), -1)
}

// wakeLocked wakes the n oldest waiters for bucket b (-1: any bucket).
func (w *topicWatch) wakeLocked(n, b int) {
	n = min(n, len(w.waiters))
	for _, wt := range w.waiters[:n] {
		wt.hint = b
		select {
		case wt.wake <- struct{}{}:
		default: // cannot happen: a woken waiter leaves the list until it drains
		}
	}
	w.waiters = slices.Delete(w.waiters, 0, n)
}

// candidates lists the buckets that may hold ready jobs not taken by a
// look (every bucket when all is set), starting at a rotating offset so that
// consumers spread over buckets, but with the bucket wt was woken for
// first. It (re)enlists wt as a waiter, so that a notification from now on
// wakes it.
func (w *topicWatch) candidates(start int, all bool, wt *waiter) []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-wt.wake: // a wake-up that came during the last look: this look serves it
	default:
	}
	if !slices.Contains(w.waiters, wt) {
		w.waiters = append(w.waiters, wt)
	}
	n := len(w.version)
	var buckets []int
	for i := -1; i < n; i++ {
		b := (start + i) % n
		switch {
		case i < 0 && wt.hint < 0:
			continue
		case i < 0:
			b = wt.hint
		case b == wt.hint:
			continue
		}
		if all || w.ready[b] != 0 {
			buckets = append(buckets, b)
		}
	}
	wt.hint = -1
	return buckets
}

// look is a Pop's look at one bucket: it asks for n jobs, and took credit
// of the bucket's count.
type look struct {
	b, n    int
	credit  int
	version uint64
}

// take plans a look at bucket b for up to want jobs. A bucket whose count
// is known is asked for no more than its count (n is 0 when it has none
// left); all asks every bucket for want.
func (w *topicWatch) take(b, want int, all bool) look {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := look{b: b, n: want, version: w.version[b]}
	if c := w.ready[b]; c != unknown {
		l.credit = min(c, want)
		w.ready[b] -= l.credit
		if !all {
			l.n = l.credit
		}
	}
	return l
}

// settle records what a look found: got jobs, and how the call ended (err
// when it failed, and nothing is known).
func (w *topicWatch) settle(l look, got int, status reserveStatus, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err != nil || status == onlyStale:
		// The list may still hold what the look took credit for: give
		// it back, and to a waiter.
		if back := l.credit - min(got, l.credit); back > 0 {
			if w.ready[l.b] != unknown {
				w.ready[l.b] += back
			}
			w.wakeLocked(back, l.b)
		}
	case status == listEmpty && w.version[l.b] == l.version:
		w.ready[l.b] = 0
	}
}

// leave takes a returning Pop off the waiters. A wake-up it was given and
// did not act on goes to the next waiter.
func (w *topicWatch) leave(wt *waiter) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if i := slices.Index(w.waiters, wt); i >= 0 {
		w.waiters = slices.Delete(w.waiters, i, i+1)
		return
	}
	select {
	case <-wt.wake:
		w.wakeLocked(1, wt.hint)
	default:
	}
}
