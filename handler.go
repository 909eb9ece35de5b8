package delayqueue

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"
)

// bucketHandler moves the due jobs of one bucket while it holds the
// bucket's lease, or stands by to take the bucket over (lock.go). It
// sleeps until the bucket's next job is due (the standby: and a grace
// more), a push makes an earlier job the bucket's first, the lease needs
// renewing, or the safety poll comes.
type bucketHandler struct {
	q     *DelayQueue
	b     int
	lease bucketLease   // owned by the handler goroutine, and by Close once it has ended
	sig   chan struct{} // buffered: a wake-up is waiting in wakeAt, free, vacant or sooner

	mu     sync.Mutex
	wakeAt time.Time // the earliest wake-up asked for since the last look
	free   bool      // the lease holder released the lease
	tickAt time.Time // when to look at the bucket's schedules (schedule_tick.go); zero: at once
	vacant bool      // a standby lease is free
	sooner bool      // the standby looks sooner than the second standby planned for

	// Owned by the handler goroutine, and read by Close once it has ended.
	failures  int                  // consecutive Redis errors
	trimmed   time.Time            // when dead letters past their retention were last deleted
	buried    time.Time            // when expired tombstones were last deleted
	listening bool                 // subscribed to the bucket's wake channel
	readied   map[string]time.Time // topic -> when this holder last made jobs of it ready; not looked at since
	lookedAll time.Time            // when this handler, holder or standby, last looked at every topic's list for a lost signal
}

// everyTopic, among the topics a move looks at for a lost signal, stands
// for every topic with ready jobs in the bucket (no topic is empty). The
// holder and the standby look so once per safety poll: a signal taken
// from a job pushed ready (which no holder made ready, so none looks a
// second later) by a process that died or froze before it reserved the
// job is lost too; and the standby looks should that process be the
// holder. The consumers of started processes leave that look to them
// (waits.expired).
const everyTopic = ""

// stranded returns the topics whose jobs this holder made ready at least
// strandedAfter ago (wake_signals.go), and forgets them: the next move
// looks at their lists for a job that a lost signal left waiting.
func (h *bucketHandler) stranded(now time.Time) []string {
	var topics []string
	for topic, at := range h.readied {
		if now.Sub(at) >= strandedAfter {
			topics = append(topics, topic)
			delete(h.readied, topic)
		}
	}
	return topics
}

// untilStranded returns how long until the holder next looks for a job
// left waiting by a lost signal, or -1 when it has no look to make.
func (h *bucketHandler) untilStranded(now time.Time) time.Duration {
	wait := time.Duration(-1)
	for _, at := range h.readied {
		if d := max(at.Add(strandedAfter).Sub(now), 0); wait < 0 || d < wait {
			wait = d
		}
	}
	return wait
}

func newBucketHandler(q *DelayQueue, b int) *bucketHandler {
	return &bucketHandler{q: q, b: b, lease: bucketLease{token: newToken()}, sig: make(chan struct{}, 1), readied: map[string]time.Time{}}
}

// wake asks the handler to look at its bucket after delay: a job became
// due then.
func (h *bucketHandler) wake(delay time.Duration) {
	at := time.Now().Add(delay)
	h.mu.Lock()
	if h.wakeAt.IsZero() || at.Before(h.wakeAt) {
		h.wakeAt = at
	}
	if at.Before(h.tickAt) {
		h.tickAt = at // a tick, perhaps
	}
	h.mu.Unlock()
	h.signal()
}

// leaseFreed tells the bucket handler that the lease was released: the
// standby takes the bucket over now.
func (h *bucketHandler) leaseFreed() {
	h.mu.Lock()
	h.free = true
	h.mu.Unlock()
	h.signal()
}

// standbyVacant tells the bucket handler that a standby lease is free.
func (h *bucketHandler) standbyVacant() {
	h.mu.Lock()
	h.vacant = true
	h.mu.Unlock()
	h.signal()
}

// lookSooner tells the bucket handler that the standby will look sooner
// than the second standby planned for: it looks now, and plans again.
func (h *bucketHandler) lookSooner() {
	h.mu.Lock()
	h.sooner = true
	h.mu.Unlock()
	h.signal()
}

func (h *bucketHandler) signal() {
	select {
	case h.sig <- struct{}{}:
	default:
	}
}

func (h *bucketHandler) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		wait := h.step(ctx)
		if !h.sleep(ctx, timer, wait) {
			return
		}
	}
}

// step moves one batch, or stands by, and returns how long to wait before
// the next.
func (h *bucketHandler) step(ctx context.Context) time.Duration {
	log := h.q.opts.logger
	// Tombstones whose dedup window ended go at most once a second, and at
	// least once per step of an idle holder.
	trim := time.Since(h.buried) >= time.Second
	now := time.Now()
	stranded := h.stranded(now)
	lookAll := h.lease.role.watches() && now.Sub(h.lookedAll) >= h.q.opts.poll
	if lookAll {
		stranded = append(stranded, everyTopic)
	}
	res, err := h.q.moveDue(ctx, h.b, h.lease.token, trim, stranded...)
	if err != nil {
		if ctx.Err() != nil {
			return 0
		}
		for _, topic := range stranded {
			if topic != everyTopic {
				h.readied[topic] = now.Add(-strandedAfter) // looked at after the failure
			}
		}
		h.lease.role = roleNone
		h.failures++
		if h.failures == 1 {
			log.Warn("delayqueue: bucket handler cannot move due jobs; retrying", attrBucket, h.b, attrError, err)
		} else {
			log.Debug("delayqueue: bucket handler still failing", attrBucket, h.b, attrError, err, "failures", h.failures)
		}
		return retryBackoff(h.failures)
	}
	// Back after failures (Redis may have restarted empty), or the lease
	// this handler held was gone (Redis may have lost its data): the
	// queue's record may be gone too.
	if h.failures > 0 || (h.lease.role == roleHolder && res.fresh) {
		h.q.restoreRecord(ctx)
	}
	if h.failures > 0 {
		log.Info("delayqueue: bucket handler moves due jobs again", attrBucket, h.b, "failures", h.failures)
		h.failures = 0
	}
	was := h.lease.role
	if lookAll && res.role.watches() {
		h.lookedAll = now
	}
	if res.vacated {
		// The standby took the bucket over or the second standby its
		// place, or the holder found either silent: another may stand by.
		h.q.announce(ctx, controlStandby+strconv.Itoa(h.b))
	}
	if res.sooner {
		h.q.announce(ctx, controlSooner+strconv.Itoa(h.b))
	}
	if res.role != roleHolder {
		h.mu.Lock()
		h.tickAt = time.Time{}
		h.mu.Unlock()
		clear(h.readied) // the holder's business
	}
	switch res.role {
	case roleNone:
		return h.lease.contended(res.wait, h.q.opts.lease)
	case roleSecond:
		h.lease.role = roleSecond
		return max(res.next, time.Millisecond)
	case roleStandby:
		h.lease.role = roleStandby
		h.listen()
		wait := renewWithin(h.q.opts.lease)
		if res.next >= 0 {
			wait = min(wait, res.next)
		}
		return wait
	}
	h.lease.role = roleHolder
	h.listen()
	if (was == roleStandby || was == roleSecond) && res.fresh {
		// The holder stopped moving, or let go.
		log.Info("delayqueue: bucket handler took the bucket over", attrBucket, h.b)
	}
	if trim {
		h.buried = time.Now()
	}
	if res.moved > 0 {
		log.Debug("delayqueue: moved due jobs", attrBucket, h.b, "moved", res.moved)
	}
	for _, r := range res.ready {
		h.q.observe(ctx, Event{Kind: EventMoved, Topic: r.topic, Count: r.count})
		h.readied[r.topic] = now
	}
	// A signal given to a waiting job may be lost as the first was: the
	// holder looks again a second later, until a look finds none waiting.
	for _, topic := range res.signaled {
		h.readied[topic] = now
		log.Debug("delayqueue: signalled a ready job whose signal was lost", attrBucket, h.b, attrTopic, topic)
	}
	if h.q.opts.retention > 0 && time.Since(h.trimmed) >= h.q.opts.poll {
		h.trimmed = time.Now()
		if n, err := h.q.trimDead(ctx, h.b); err != nil {
			log.Warn("delayqueue: cannot delete expired dead letters", attrBucket, h.b, attrError, err)
		} else if n > 0 {
			log.Debug("delayqueue: deleted expired dead letters", attrBucket, h.b, "deleted", n)
		}
	}
	tick := h.ticks(ctx)
	if res.moved >= h.q.opts.batch {
		return 0 // a backlog: drain it batch by batch
	}
	wait := min(renewWithin(h.q.opts.lease), h.q.opts.poll)
	if res.next >= 0 && res.next < wait {
		wait = res.next
	}
	if tick >= 0 && tick < wait {
		wait = tick
	}
	if s := h.untilStranded(time.Now()); s >= 0 && s < wait {
		wait = s
	}
	return wait
}

// ticks fires the bucket's schedules whose tick came (schedule_tick.go), when the
// earliest tick it knows of came, or a safety poll passed since it last
// looked, and returns how long until that tick.
func (h *bucketHandler) ticks(ctx context.Context) time.Duration {
	now := time.Now()
	h.mu.Lock()
	at := h.tickAt
	if at.IsZero() || !now.Before(at) {
		h.tickAt = now.Add(h.q.opts.poll)
	}
	h.mu.Unlock()
	if !at.IsZero() && now.Before(at) {
		return time.Until(at)
	}
	next, err := h.q.fireTicks(ctx, h.b)
	if err != nil {
		if ctx.Err() == nil { // not the end of Close
			h.q.opts.logger.Warn("delayqueue: bucket handler cannot fire schedules", attrBucket, h.b, attrError, err)
		}
		next = retryBackoff(1)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if next >= 0 && now.Add(next).Before(h.tickAt) {
		h.tickAt = now.Add(next)
	}
	return time.Until(h.tickAt)
}

// listen has the notifier carry the bucket's wake channel to this handler,
// once it holds or stands by for the lease: the other processes' handlers
// hear none of it.
func (h *bucketHandler) listen() {
	if !h.listening {
		h.listening = true
		h.q.listenForBucket(h.b)
	}
}

// replanBy is how much earlier than the look its lease announces a
// standby woken for a job (its due time and takeoverGrace) must come to
// look at once, to announce the new look: the second standby plans its
// look by the announced one, and is told of it (move.lua's
// MOVE_REPLAN_MS). It takes a job that becomes the first of a bucket
// whose standby planned over a second further out, as a quiet bucket's
// does (a third of the lease); a push behind the bucket's first job, or
// less than a second before it, costs nothing.
const replanBy = time.Second

// sleep waits for wait, or less when woken for an earlier due job (the
// standby: that plus the grace, or at once when that comes replanBy
// before the look it announced), for a freed lease (the standby, and those
// without a role), for a vacant standby lease (the second standby, and
// those without a role), or for the standby's sooner look (the second
// standby). It returns false when ctx ends.
func (h *bucketHandler) sleep(ctx context.Context, timer *time.Timer, wait time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	deadline := time.Now().Add(wait)
	planned := deadline // a standby's: the look its lease announces
	timer.Reset(wait)
	for {
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
			return true
		case <-h.sig:
			h.mu.Lock()
			at, free, vacant, sooner := h.wakeAt, h.free, h.vacant, h.sooner
			h.wakeAt, h.free, h.vacant, h.sooner = time.Time{}, false, false, false
			h.mu.Unlock()
			role := h.lease.role
			switch {
			case free && role != roleHolder, vacant && !role.watches(), sooner && role == roleSecond:
				return true
			case !role.watches():
				continue
			case role == roleStandby && !at.IsZero():
				at = at.Add(takeoverGrace)
				if at.Before(planned.Add(-replanBy)) {
					// The second standby planned for the announced look:
					// look now, and the new look is announced and told
					// (move.lua), so that holder and standby dying before
					// it do not leave the job to the old plan.
					return true
				}
			}
			if !at.IsZero() && at.Before(deadline) {
				deadline = at
				d := time.Until(deadline)
				if d <= 0 {
					return true
				}
				timer.Reset(d)
			}
		}
	}
}

// release gives up the leases at Close, if this bucket handler holds one.
func (h *bucketHandler) release(ctx context.Context) error {
	return h.lease.release(ctx, h.q, h.b)
}

// retryBackoff is the wait after n consecutive Redis errors: 50ms doubling
// up to 5s, with jitter so that handlers do not retry in step.
func retryBackoff(n int) time.Duration {
	d := 50 * time.Millisecond << min(n-1, 7)
	d = min(d, 5*time.Second)
	return d/2 + rand.N(d/2+1)
}
