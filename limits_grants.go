package delayqueue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/dqueue/delayqueue/internal/batch"
	"github.com/redis/go-redis/v9"
)

// Grants: the capacity a consumer of a limited topic takes before it
// reserves, and gives back when its jobs are settled (see limits.go).

// grantSlack is how much longer than the TTR of the topic's jobs a grant
// lasts before it is bound to a job: a job's reservation starts a moment
// after its grant, and its grant must not run out before it. A grant bound
// to a job lasts about as long past the job's reservation (from half to
// twice as long: it is not moved for less), so that an extension of the
// reservation, which touch.lua makes only before it runs out, moves the
// grant before the grant runs out.
const grantSlack = time.Second

// boundDeadline is the deadline a grant moves to when bound to a
// reservation until (ms): grantSlack past it.
func boundDeadline(until int64) int64 { return until + grantSlack.Milliseconds() }

// boundWell reports whether a grant of deadline, bound to a reservation
// until, may stay as it is: from half to twice grantSlack past it.
func boundWell(deadline, until int64) bool {
	slack := grantSlack.Milliseconds()
	d := deadline - until
	return d >= slack/2 && d <= 2*slack
}

// grant is what one acquire call granted: the grants named call:1 to
// call:n, scored by deadline (ms, the server's clock) until bound.
type grant struct {
	topic    string
	call     string
	handed   string // or the one grant handed over by a settled job (renew)
	n        int
	deadline int64
	// counted says that the topic has a Concurrency: its grants are held
	// until their jobs are settled, and recorded beside them
	// (scripts/lib/grants.lua). A Rate's alone are not given back.
	counted bool
}

// names is what reserve.lua records as the grants of the jobs a reserve
// call reserves for g, the from-th (from 0) to the from+n-1-th: none when
// g does not count.
func (g *grant) names(from, n int) []string {
	if g == nil || !g.counted {
		return nil
	}
	out := make([]string, n)
	for i := range out {
		if from+i < g.n {
			out[i] = g.name(from + i + 1)
		}
	}
	return out
}

// name is the name of grant i (from 1).
func (g *grant) name(i int) string {
	if g.handed != "" {
		return g.handed
	}
	return g.call + ":" + strconv.Itoa(i)
}

// acquire takes up to want grants of topic. It returns a nil grant when
// the topic has no limits. When none is granted, wait is how long until
// capacity is due (negative: not known) and full says that Concurrency is
// used up, so that a grant given back wakes the caller.
func (q *DelayQueue) acquire(ctx context.Context, topic string, want int) (g *grant, wait time.Duration, full bool, err error) {
	limited, err := q.isLimited(ctx, topic)
	if err != nil || !limited {
		return nil, 0, false, err
	}
	call := q.callName()
	hold := q.limiter.hold(topic, q.opts.ttr) + grantSlack
	lk := q.keys.limit(topic)
	calls := []*scriptCall{{script: scriptAcquire,
		keys: []string{q.keys.limits(), lk.run, lk.rate, q.keys.grantRecord(call)},
		args: []any{topic, call, want, hold.Milliseconds(), q.recordLife.Milliseconds()}}}
	q.sendCalls(ctx, calls)
	// A call whose reply was lost is sent again: its second run answers
	// from its record, and grants nothing twice.
	q.resendUnanswered(ctx, calls, resendWindow)
	res, err := calls[0].cmd.Int64Slice()
	if err == nil && len(res) != 6 {
		err = fmt.Errorf("unexpected reply %v", res)
	}
	if err != nil {
		return nil, 0, false, fmt.Errorf("delayqueue: acquire capacity of %q: %w", topic, err)
	}
	if res[0] == acquireNoLimits {
		return nil, 0, false, nil // the limits were removed since they were read
	}
	if res[0] > 0 {
		q.limiter.answered(q.keys.grantRecord(call))
	}
	q.limiter.rated(topic, res[4] == 1)
	return &grant{topic: topic, call: call, n: int(res[0]), deadline: res[1], counted: res[5] == 1},
		time.Duration(res[2]) * time.Millisecond, res[3] == 1, nil
}

// bind takes the jobs reserved with g, each holding the grant its reserve
// call recorded for it (placed), moves the deadline of those whose
// reservations run past it, and gives back the grants no call recorded:
// those after the first used. A failure is logged: the grants run out at
// their deadline. A grant of a Rate alone is not held: its job holds none.
func (q *DelayQueue) bind(ctx context.Context, g *grant, jobs []*Job, used int) {
	if g == nil {
		return
	}
	gb := &giveBack{topic: g.topic}
	for _, job := range jobs {
		if !g.counted {
			break // a Rate's grants are not held
		}
		q.limiter.sawTTR(g.topic, job.TTR)
		if until := job.ReservedUntil.UnixMilli(); !boundWell(g.deadline, until) {
			gb.moved = append(gb.moved, job.grant, boundDeadline(until))
		}
	}
	for i := used + 1; i <= g.n; i++ {
		gb.unused = append(gb.unused, g.name(i))
	}
	if len(gb.unused) > 0 || len(gb.moved) > 0 {
		q.giveBackNow(ctx, gb)
	}
}

// settledGrant gives back the grant of a job of topic that a settling call
// (finish, retry, release) ended with err: a job settled, or no longer
// held. After another error the job may still be reserved: its grant
// runs out with its reservation.
func (q *DelayQueue) settledGrant(ctx context.Context, topic, grant string, err error) {
	if grant == "" || !settledOK(err) {
		return
	}
	// A consumer of this process waiting at the limit takes the grant
	// over: no round trip to give it back, none to wake, none to take it.
	// After Close, none takes it: it goes back. So does the grant of a
	// job no longer held (err): whoever settled it may be giving it back
	// (scripts/lib/grants.lua), and a consumer must not reserve with it.
	if q.closed.Load() || err != nil || !q.limiter.handOver(topic, grant) {
		q.giveBackGrant(ctx, topic, grant)
	}
}

// giveBackGrant gives grant of topic back to Redis, which wakes a consumer
// waiting at the limit in whichever process, even when ctx has ended.
// It is how a grant taken from a job's record goes back (Finish by ID,
// Remove, Upsert; scripts/lib/grants.lua): never to a consumer of this
// process, as settledGrant may, for the process that reserved the job
// still holds the grant's name and gives it back in turn when it finds
// the job gone, which would free the slot of a job reserved with it here.
func (q *DelayQueue) giveBackGrant(ctx context.Context, topic, grant string) {
	q.giveBackNow(context.WithoutCancel(ctx), &giveBack{topic: topic, settled: []string{grant}})
}

// extendedGrants moves the deadlines of the grants of jobs whose
// reservations were just extended.
func (q *DelayQueue) extendedGrants(ctx context.Context, jobs []*Job, errs []error) {
	byTopic := map[string]*giveBack{}
	for i, job := range jobs {
		if job.grant == "" || errs[i] != nil {
			continue
		}
		gb := byTopic[job.Topic]
		if gb == nil {
			gb = &giveBack{topic: job.Topic}
			byTopic[job.Topic] = gb
		}
		gb.moved = append(gb.moved, job.grant, boundDeadline(job.ReservedUntil.UnixMilli()))
	}
	for _, gb := range byTopic {
		q.giveBackNow(ctx, gb)
	}
}

// giveBack is one topic's grants to give back or move.
type giveBack struct {
	topic   string
	unused  []string // granted, and no job reserved with them
	settled []string // their jobs were settled
	moved   []any    // grant, new deadline ms, ...
}

// giveBackNow sends gb, together with the others given back meanwhile,
// and logs a failure: the grants then run out at their deadlines.
func (q *DelayQueue) giveBackNow(ctx context.Context, gb *giveBack) {
	if err := q.givebacks.Do(ctx, gb); err != nil {
		q.opts.logger.Warn("delayqueue: cannot give back capacity; it comes back when its reservations run out",
			attrTopic, gb.topic, attrError, err)
	}
}

// giveBackLane coalesces the grants given back: one script call per topic.
func (q *DelayQueue) giveBackLane() *batch.Lane[*giveBack] {
	return batch.NewLane(maxPipelinedCalls, 2, q.flushGiveBacks)
}

func (q *DelayQueue) flushGiveBacks(ctx context.Context, reqs []*batch.Request[*giveBack]) {
	groups := batch.GroupBy(reqs, func(gb *giveBack) string { return gb.topic },
		func(*giveBack) int { return 1 }, maxPipelinedCalls)
	calls := make([]*scriptCall, len(groups))
	for i, g := range groups {
		var unused, settled, moved []any
		for _, r := range g.Reqs {
			for _, s := range r.In.unused {
				unused = append(unused, s)
			}
			for _, s := range r.In.settled {
				settled = append(settled, s)
			}
			moved = append(moved, r.In.moved...)
		}
		lk := q.keys.limit(g.Key)
		keys := []string{lk.run, lk.rate, lk.free}
		if i == 0 {
			keys = append(keys, q.limiter.takeAnswered()...)
		}
		args := append([]any{len(unused), len(settled)}, unused...)
		calls[i] = &scriptCall{script: scriptGiveBack, keys: keys, args: append(append(args, settled...), moved...)}
	}
	q.sendCalls(ctx, calls)
	for i, g := range groups {
		err := calls[i].cmd.Err()
		if err != nil {
			err = fmt.Errorf("delayqueue: give back capacity of %q: %w", g.Key, err)
		}
		for _, r := range g.Reqs {
			r.Err = err
		}
	}
}

// awaitCapacity waits at topic's limit, after an acquire granted nothing:
// until a grant is given back (full: Redis hands the wake-up to one waiting
// consumer, in whichever process), until wait (when the next capacity is
// due), until the limits change, or until a job of this process settles
// and hands its grant over (returned: the grant's name). It returns
// ErrNoJob at until (the pop's deadline), ctx.Err() when ctx ends and
// ErrClosed when the queue closes. Only a wait for given-back grants talks
// to Redis: one blocked call.
func (q *DelayQueue) awaitCapacity(ctx context.Context, topic string, wait time.Duration, full bool, until time.Time) (string, error) {
	remaining := time.Until(until)
	if remaining <= 0 {
		return "", ErrNoJob
	}
	if wait < 0 || wait > blockFor {
		wait = blockFor
	}
	d := min(wait, remaining)
	lw := q.limiter.enter(topic, q.keys.limitPoke(q.callName()))
	var handed string
	defer func() {
		// A grant handed over after the wait ended goes back.
		if g := q.limiter.leave(topic, lw); g != "" {
			q.giveBackGrant(ctx, topic, g)
		}
	}()
	q.observe(ctx, Event{Kind: EventLimited, Topic: topic})
	timer := time.NewTimer(d)
	defer timer.Stop()
	free := q.keys.limit(topic).free
	var blocked chan blpopResult
	if full && !q.limiter.expects(topic) {
		// Ended by a wake-up, a poke at d, at ctx's end or at Close (the
		// call does not end with its context).
		blocked = make(chan blpopResult, 1)
		go func() {
			secs := math.Ceil(d.Seconds()) + 1
			client, err := q.blocker()
			if err != nil {
				blocked <- blpopResult{nil, err}
				return
			}
			res, err := client.BLPop(context.WithoutCancel(ctx), time.Duration(secs)*time.Second, free, lw.poke).Result()
			blocked <- blpopResult{res, err}
		}()
	}
	select {
	case r := <-blocked:
		if q.closed.Load() {
			return "", ErrClosed
		}
		if r.err != nil && !errors.Is(r.err, redis.Nil) {
			q.noteError(ctx, r.err)
			return "", fmt.Errorf("delayqueue: wait for capacity of %q: %w", topic, redisError(r.err))
		}
		return "", nil
	case handed = <-lw.handed:
	case <-ctx.Done():
	case <-q.done:
	case <-lw.wake:
	case <-timer.C:
	}
	if blocked != nil {
		q.pokeKeys([]string{lw.poke})
		// A wake-up the call took after all is passed on to another
		// consumer; with a grant in hand, not waited for.
		passOn := func() {
			if r := <-blocked; r.err == nil && len(r.res) == 2 && r.res[0] == free {
				q.pokeKeys([]string{free})
			}
		}
		if handed != "" {
			go passOn()
		} else {
			passOn()
		}
	}
	switch {
	case handed != "":
		return handed, nil
	case ctx.Err() != nil:
		return "", ctx.Err()
	case q.closed.Load():
		return "", ErrClosed
	case !time.Now().Before(until):
		return "", ErrNoJob
	}
	return "", nil
}

type blpopResult struct {
	res []string
	err error
}

// renew makes grant name, handed over by a job of this process that
// settled, a grant for the next reservation (renew.lua), while the caller
// reserves already: the grant it returns is known good once renewed says
// so (bindRenewed).
func (q *DelayQueue) renew(ctx context.Context, topic, name string) (*grant, chan error) {
	g := &grant{topic: topic, handed: name, n: 1, counted: true}
	renewed := make(chan error, 1)
	go func() {
		calls := []*scriptCall{q.renewCall(topic, name)}
		q.sendCalls(ctx, calls)
		renewed <- g.renewed(calls[0].cmd, 0)
	}()
	return g, renewed
}

// renewCall is renew.lua's call for grants of topic.
func (q *DelayQueue) renewCall(topic string, grants ...string) *scriptCall {
	lk := q.keys.limit(topic)
	hold := q.limiter.hold(topic, q.opts.ttr) + grantSlack
	args := []any{topic, hold.Milliseconds()}
	for _, g := range grants {
		args = append(args, g)
	}
	return &scriptCall{script: scriptRenew, keys: []string{q.keys.limits(), lk.run}, args: args}
}

// renewed reads renew.lua's reply for g, its i-th grant: nil when renewed
// (g's deadline is then set), errNotRenewed when the grant does not stand.
func (g *grant) renewed(cmd *redis.Cmd, i int) error {
	res, err := cmd.Int64Slice()
	switch {
	case err == nil && len(res) < i+2:
		err = fmt.Errorf("unexpected reply %v", res)
	case err == nil && res[i+1] != renewDone:
		return errNotRenewed
	case err == nil:
		g.deadline = res[0]
		return nil
	}
	return fmt.Errorf("delayqueue: renew capacity of %q: %w", g.topic, err)
}

var errNotRenewed = errors.New("delayqueue: grant not renewed")

// bindRenewed binds g to jobs, as bind does, once its renewal (if any)
// came through; when it did not, the jobs reserved with it are released
// to ready at once, the grant is given back after them, and it reports
// false.
func (q *DelayQueue) bindRenewed(ctx context.Context, g *grant, renewed chan error, jobs []*Job, used int) bool {
	if renewed != nil {
		if err := <-renewed; err != nil {
			q.unrenewed(ctx, g, err, jobs)
			return false
		}
	}
	q.bind(ctx, g, jobs, used)
	return true
}

// unrenewed releases jobs, reserved with g whose renewal failed with err,
// and then gives g back: not before, so that the grant counts while they
// are reserved.
func (q *DelayQueue) unrenewed(ctx context.Context, g *grant, err error, jobs []*Job) {
	if err != errNotRenewed {
		q.opts.logger.Warn("delayqueue: cannot renew capacity; taking it anew", attrTopic, g.topic, attrError, err)
	}
	released := true
	for _, job := range jobs {
		if err := q.release(context.WithoutCancel(ctx), job); err != nil {
			released = false
			q.opts.logger.Warn("delayqueue: cannot release a job reserved without capacity; it comes back after its TTR",
				attrTopic, job.Topic, attrJobID, job.ID, attrError, err)
		}
	}
	if released { // else the grant runs out at its deadline
		q.giveBackGrant(ctx, g.topic, g.handed)
	}
}

// pokeKeys pushes the keys of consumers waiting at a limit, to end their
// blocked calls.
func (q *DelayQueue) pokeKeys(keys []string) {
	if len(keys) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pipe := q.client.Pipeline()
	for _, k := range keys {
		pipe.RPush(ctx, k, "1")
		pipe.PExpire(ctx, k, time.Minute) // a key nobody pops goes
	}
	if _, err := pipe.Exec(ctx); err != nil {
		q.opts.logger.Warn("delayqueue: cannot wake a consumer waiting at a limit; it looks again at its next capacity", attrError, err)
	}
}

// limitsChanged has the consumers of topic ("": of every topic) waiting
// at a limit look again, as the limits changed.
func (q *DelayQueue) limitsChanged(topic string) {
	q.pokeKeys(q.limiter.changed(topic))
}
