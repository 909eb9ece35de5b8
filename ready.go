package delayqueue

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/dqueue/delayqueue/internal/batch"
	"github.com/redis/go-redis/v9"
)

// Each bucket keeps one ready list per topic, and beside it the topic's
// ready signals (wake_signals.go). A consumer of a topic reserves from the lists
// of every bucket, but only where this process holds a signal or signals
// are left, and no more jobs than those: an idle consumer waits in a
// blocked call and sends Redis nothing more, and n jobs made ready wake n
// consumers, whichever processes they are in.

// staleSkips bounds how many stale IDs one reserve call drops.
const staleSkips = 100

// maxReserve bounds how many jobs one reserve call reserves: a script
// unpacks two values per job, and Redis's Lua unpacks at most 8,000.
const maxReserve = 256

// reserveCall is one consumer's look at one bucket's ready list.
type reserveCall struct {
	b      int
	topic  string
	want   int
	held   int // signals the consumer holds
	mode   reserveMode
	grants []string // the grant each job reserved holds, by place (grant.names)
	// jobs are the jobs reserved, in their places, which a second run of
	// the call keeps: nil for a job another process settled after the
	// first (reserve.lua's replay; see placed).
	jobs   []*Job
	status reserveStatus
	// left is the signals the list holds after the call; or, when none,
	// reserveNoSignal (jobs are left: their signals are on their way, or
	// were lost) or reserveDry (no job is left).
	left int
}

// reserve pops and reserves up to want ready jobs of topic from bucket b,
// with held signals of the caller's, each job with its grant of grants,
// and says how the call ended and how many signals are left. Pops that
// look at the same list at the same time share one script call.
func (q *DelayQueue) reserve(ctx context.Context, b int, topic string, want, held int, mode reserveMode, grants ...string) (*reserveCall, error) {
	c := &reserveCall{b: b, topic: topic, want: want, held: held, mode: mode, grants: grants}
	if err := q.reserves.For(b).Do(ctx, c); err != nil {
		return nil, err
	}
	return c, nil
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
		b      int
		topic  string
		greedy bool
	}
	// One call per list, or more when the requests want more than
	// maxReserve jobs together (each wants at most maxReserve).
	groups := batch.GroupBy(reqs,
		func(c *reserveCall) list { return list{c.b, c.topic, c.mode == reserveGreedy} },
		func(c *reserveCall) int { return c.want }, maxReserve)
	calls := make([]*scriptCall, len(groups))
	rides := make([][]*batch.Request[*finishCall], len(groups))
	give := make([]int, len(groups)) // signals each call takes for waiting consumers
	q.mu.Lock()
	w := q.waits
	q.mu.Unlock()
	for i, g := range groups {
		// A call comes only to claim signals when all its requests do,
		// and only for a lost signal when none of them comes to look.
		held, mode := 0, reserveClaim
		for _, r := range g.Reqs {
			held += r.In.held
			mode = mode.with(r.In.mode)
		}
		// The finishes of the bucket that wait to be sent go with the
		// call, rather than in one of their own; not those of jobs this
		// process does not hold, whose grants only finish.lua's reply
		// carries.
		b := g.Key.b
		rides[i] = q.finishes.For(b).Take(maxReserve, func(c *finishCall) bool { return c.b == b && c.reservation != any("") })
		// The signals left go to this process's consumers that wait, in
		// the same call, rather than to claims that other processes'
		// blocked pops race.
		if w != nil && !g.Key.greedy {
			give[i] = w.toGive(g.Key.topic)
		}
		calls[i] = q.reserveCall(b, g.Key.topic, g.Size, held, mode, finishCalls(rides[i]), give[i], reservedGrants(g.Reqs)...)
		if len(rides[i]) > 0 {
			// The finishes must not end with the popper's wait (a
			// Consume that stops): the call goes whole, as a batch of
			// several callers' does (internal/batch).
			ctx = context.WithoutCancel(ctx)
		}
	}
	q.sendCalls(ctx, calls)
	// A call whose reply was lost may have reserved jobs that nobody
	// would receive before their TTR: it is sent again, and its second
	// run answers from its record.
	q.resendUnanswered(ctx, calls, resendWindow)
	q.answered(calls)
	for i, g := range groups {
		finished, err := reserveFinishes(calls[i])
		for j, r := range rides[i] {
			if r.Err = err; err == nil {
				r.In.status = finished[j]
			}
			r.Done()
		}
		jobs, status, left, err := q.reserved(ctx, g.Key.b, g.Key.topic, calls[i])
		if give[i] > 0 {
			given := 0
			if err == nil {
				given = reserveGiven(calls[i].cmd)
			}
			w.gave(g.Key.topic, g.Key.b, give[i], given)
		}
		for _, r := range g.Reqs {
			n := min(r.In.want, len(jobs))
			r.In.jobs, jobs = jobs[:n:n], jobs[n:]
			r.In.status, r.In.left, r.Err = status, left, err
		}
	}
}

// reserveCall is reserve.lua's call for up to n jobs of topic from bucket
// b, with held signals, that first finishes the jobs of finishes (triples
// of a job ID, a reservation and whether the caller holds its grant, as
// finish.lua takes them), takes up to give of the signals left for other
// consumers of this process (reserveGiven), and records the grant of
// grants each job it reserves holds, in order. Its record slot is handed
// back by answered, once the call is answered.
func (q *DelayQueue) reserveCall(b int, topic string, n, held int, mode reserveMode, finishes []any, give int, grants ...string) *scriptCall {
	bk := q.keys.bucket(b)
	slot := q.records.take()
	args := make([]any, 0, 13+len(finishes)+len(grants))
	args = append(args, bk.wake, q.pub, staleSkips, topic, n, q.recordLife.Milliseconds(), held, int(mode), q.callName(), len(finishes)/3)
	args = append(args, finishes...)
	args = append(args, give, len(grants))
	for _, g := range grants {
		args = append(args, g)
	}
	return &scriptCall{script: scriptReserve,
		keys: []string{bk.ready(topic), bk.pool, bk.zset, bk.reservations,
			q.recordKey(bk, slot), bk.counts, bk.signals(topic), bk.paused, bk.dedup, bk.lost(topic), bk.grants},
		args:   args,
		record: slot, recorded: true, finishes: len(finishes) / 3}
}

// reservedGrants returns the grants of the jobs a reserve call reserves
// for reqs, in order: each takes its want of the jobs, in turn (see
// flushReserves); none when no request holds grants.
func reservedGrants(reqs []*batch.Request[*reserveCall]) []string {
	if !slices.ContainsFunc(reqs, func(r *batch.Request[*reserveCall]) bool { return len(r.In.grants) > 0 }) {
		return nil
	}
	var out []string
	for _, r := range reqs {
		gs := make([]string, r.In.want)
		copy(gs, r.In.grants)
		out = append(out, gs...)
	}
	return out
}

// finishCalls returns the arguments that finish the jobs of reqs: triples
// of a job ID, a reservation, and "1" when the caller holds its grant.
func finishCalls(reqs []*batch.Request[*finishCall]) []any {
	args := make([]any, 0, 3*len(reqs))
	for _, r := range reqs {
		args = append(args, r.In.id, r.In.reservation, grantFlag(r.In.granted))
	}
	return args
}

// grantFlag is how the scripts take whether a caller holds a job's grant.
func grantFlag(held bool) string {
	if held {
		return "1"
	}
	return ""
}

// reserveFinishes reads the answers of the finishes reserve call c made
// (reserveCall), which end its reply.
func reserveFinishes(c *scriptCall) ([]int64, error) {
	n := c.finishes
	if n == 0 {
		return nil, nil
	}
	res, err := c.cmd.Slice()
	if err != nil {
		return nil, err
	}
	if len(res) < 3+n {
		return nil, fmt.Errorf("unexpected reply %v", res)
	}
	out := make([]int64, n)
	for i := range out {
		v, ok := res[len(res)-n+i].(int64)
		if !ok {
			return nil, fmt.Errorf("unexpected reply %v", res)
		}
		out[i] = v
	}
	return out, nil
}

// reserved reads the reply of reserve call c (reserveCall) of bucket b.
func (q *DelayQueue) reserved(ctx context.Context, b int, topic string, c *scriptCall) ([]*Job, reserveStatus, int, error) {
	jobs, status, left, err := reserveResult(c.cmd, c.finishes)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("delayqueue: pop %q from bucket %d: %w", topic, b, err)
	}
	n := 0
	for _, job := range jobs {
		if job != nil {
			job.queue = q.ident
			q.read(job)
			n++
		}
	}
	q.observe(ctx, Event{Kind: EventReserveCall, Topic: topic, Count: n, Finishes: c.finishes, Unclaimed: status == reserveUnclaimed})
	return jobs, status, left, nil
}

// placed returns the jobs of places, the jobs a reserve call reserved in
// their places, each with the grant that names records for its place
// (none when names is empty). A nil place, a job another process settled
// before the call's second run, is left out: its grant went with it, to
// whoever settled it (scripts/lib/grants.lua), and the grants of the jobs
// after it are still those of their places.
func placed(places []*Job, names []string) []*Job {
	jobs := make([]*Job, 0, len(places))
	for i, job := range places {
		if job == nil {
			continue
		}
		if i < len(names) {
			job.grant = names[i]
		}
		jobs = append(jobs, job)
	}
	return jobs
}

// reserveResult reads reserve.lua's reply to a call that finished
// finishes jobs first: the jobs reserved, in their places (nil for a job
// settled elsewhere before a second run), how the call ended, and the
// signals left.
func reserveResult(cmd *redis.Cmd, finishes int) ([]*Job, reserveStatus, int, error) {
	res, err := cmd.Slice()
	if err != nil {
		return nil, 0, 0, err
	}
	if len(res) < 2+finishes {
		return nil, 0, 0, fmt.Errorf("unexpected reply %v", res)
	}
	res = res[:len(res)-finishes]
	if len(res)%3 != 0 {
		return nil, 0, 0, fmt.Errorf("unexpected reply %v", res)
	}
	status, ok := res[0].(int64)
	left, ok2 := res[1].(int64)
	_, ok3 := res[2].(int64)
	if !ok || !ok2 || !ok3 || status < int64(reserveRanOut) || status > int64(reserveUnclaimed) {
		return nil, 0, 0, fmt.Errorf("unexpected reply %v", res)
	}
	var jobs []*Job
	for i := 3; i < len(res); i += 3 {
		id, _ := res[i].(string)
		v, ok := res[i+1].(string)
		if !ok && res[i+1] == nil {
			jobs = append(jobs, nil) // settled elsewhere before this second run
			continue
		}
		job, err := decodeJob(id, []byte(v))
		if err != nil {
			return nil, 0, 0, err
		}
		if due, _ := res[i+2].(int64); due > 0 {
			job.dueAt = time.UnixMilli(due)
			job.RunAt = job.dueAt // the due time it was delivered for
		}
		jobs = append(jobs, job)
	}
	return jobs, reserveStatus(status), int(left), nil // left may be reserveNoSignal or reserveDry
}

// reserveGiven reads how many signals a reserve call took for other
// consumers of this process (reserveCall's give): none when the reply is
// not one reserveResult reads.
func reserveGiven(cmd *redis.Cmd) int {
	res, err := cmd.Slice()
	if err != nil || len(res) < 3 {
		return 0
	}
	n, _ := res[2].(int64)
	return int(n)
}

// withSignal puts first in looks the bucket of the signals that woke a
// consumer that wants want jobs, with any signals the process holds there,
// in one reserve call.
func withSignal(looks []look, u wakeUp, want int) []look {
	first := look{b: u.b, n: want, held: u.n}
	if j := slices.IndexFunc(looks, func(l look) bool { return l.b == u.b }); j >= 0 {
		first.held += looks[j].held
		looks = slices.Delete(looks, j, j+1)
	}
	return slices.Insert(looks, 0, first)
}

// Pop reserves the oldest ready job of topic for its TTR, waiting up to
// timeout for one (zero or less: it looks once). Finish the job within its
// TTR, or it is delivered again. Pop returns ErrNoJob when no job became
// ready in time, ctx.Err() when ctx ends, ErrClosed when the queue is
// closed, and ErrInvalidTopic for a bad topic. It is safe for concurrent
// use. A reserve call that carries other callers' requests (concurrent
// pops, or Consume's finishes) is not cut off when ctx ends: a Pop whose
// ctx ends while such a call is on its way returns the job that call
// reserved for it, if it reserved one.
func (q *DelayQueue) Pop(ctx context.Context, topic string, timeout time.Duration) (*Job, error) {
	sent := time.Now()
	jobs, err := q.pop(ctx, topic, 1, timeout)
	if err != nil {
		return nil, err
	}
	// Finish(ctx, id) checks this reservation (see settle_held.go). A look that
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
	w, err := q.waiting()
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(timeout)
	wt := &waiter{wake: make(chan wakeUp, 1)}
	defer w.leave(topic, wt)
	var timer *time.Timer
	signal := wakeUp{b: noSignal} // or signals taken for this consumer
	defer func() {
		if signal.b >= 0 { // not used: an error came first
			w.unused(topic, signal.b, signal.n)
		}
	}()
	for {
		// A limited topic's consumer takes grants first, and reserves no
		// more jobs than granted (limits_grants.go).
		var g *grant
		var wait time.Duration
		var full bool
		if q.limiter.expects(topic) {
			g, wait, full = &grant{topic: topic}, -1, true // a settling job's grant may come
		} else {
			g, wait, full, err = q.acquire(ctx, topic, want)
		}
		var renewed chan error // a grant handed over, being renewed
		for err == nil && g != nil && g.n == 0 {
			if signal.b >= 0 {
				w.unused(topic, signal.b, signal.n) // for a consumer that gets capacity
				signal.b = noSignal
			}
			var handed string
			if handed, err = q.awaitCapacity(ctx, topic, wait, full, deadline); err == nil {
				if handed == "" {
					g, wait, full, err = q.acquire(ctx, topic, want)
				} else {
					g, renewed = q.renew(ctx, topic, handed)
				}
			}
		}
		if err != nil {
			return nil, err
		}
		want := want
		if g != nil {
			want = g.n
		}
		start := int(q.rotor.Add(1) % uint32(q.opts.buckets))
		resumes := w.resumed(topic) // before the calls: see settle
		var looks []look
		if signal.b >= 0 {
			// Signals beyond want (fewer jobs granted than signals
			// taken) go on with the first look's, below.
			looks = withSignal(w.plan(topic, max(want-signal.n, 0), start, timeout <= 0), signal, want)
			signal.b = noSignal
		} else {
			looks = w.plan(topic, want, start, timeout <= 0)
		}
		var got []*Job
		used := 0 // g's grants recorded by the calls: one per place
		again := false
		for i, l := range looks {
			taken := len(got)
			if g != nil {
				taken = used // a grant per place: a job settled elsewhere took its own
			}
			n := min(want-taken, maxReserve)
			if l.held > n {
				// More signals than jobs still wanted (fewer granted, or
				// an earlier look claimed jobs): the rest go to another
				// consumer, for a reserve call drops the signals it holds
				// beyond the jobs it takes.
				w.unused(topic, l.b, l.held-n)
				l.held = n
			}
			if n == 0 || timeout > 0 && w.outdated(topic, l) {
				continue
			}
			mode := reserveSignalled
			switch {
			case timeout <= 0:
				mode = reserveGreedy
			case l.claim:
				mode = reserveClaim
			case l.lost:
				mode = reserveLost
			}
			k := min(n, max(l.n, l.held))
			names := g.names(used, k)
			c, err := q.reserve(ctx, l.b, topic, k, l.held, mode, names...)
			if err != nil {
				// The signals of this look and of those not sent go to
				// another consumer: one too many costs a look, one too few
				// leaves a job waiting.
				w.unused(topic, l.b, l.held)
				for _, rest := range looks[i+1:] {
					w.unused(topic, rest.b, rest.held)
				}
			}
			if err == nil {
				resumedSince := w.settle(topic, l.b, c.left, c.status, resumes)
				if l.lost {
					w.lostLooked(topic, l.b, c.status == reserveUnclaimed)
				}
				jobs := placed(c.jobs, names)
				used += len(c.jobs)
				q.observeReserved(ctx, jobs)
				got = append(got, jobs...)
				again = again || c.status == reserveStale || resumedSince
			}
			switch {
			case err != nil && len(got) > 0:
				// The jobs are reserved and the caller owns them; the
				// error is logged here and met again on its next pop.
				q.opts.logger.Warn("delayqueue: cannot pop from a bucket; returning the jobs reserved so far",
					attrTopic, topic, attrBucket, l.b, attrError, err)
				if !q.bindRenewed(ctx, g, renewed, got, used) {
					return nil, err
				}
				return got, nil
			case err != nil:
				q.bindRenewed(ctx, g, renewed, nil, used)
				return nil, err
			}
		}
		if !q.bindRenewed(ctx, g, renewed, got, used) {
			continue
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
		wt.want = want // no more signals than jobs granted
		w.enlist(topic, wt)
		// The wait ends for a signal, or at the deadline; each safety
		// poll on the way, the pop looks whether any process started.
		next := min(remaining, q.opts.poll)
		if timer == nil {
			timer = time.NewTimer(next)
			defer timer.Stop()
		} else {
			timer.Reset(next)
		}
	wait:
		for {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-q.done:
				return nil, ErrClosed
			case signal = <-wt.wake:
				break wait
			case <-timer.C:
				q.checkStarted(ctx)
				remaining := time.Until(deadline)
				if remaining <= 0 {
					return nil, ErrNoJob
				}
				timer.Reset(min(remaining, q.opts.poll))
			}
		}
	}
}
