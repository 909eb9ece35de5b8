package delayqueue

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"time"
)

// bucketHandler moves the due jobs of one bucket while it holds the bucket's lease.
// It sleeps until the bucket's next job is due, a push makes an earlier job
// the bucket's first, the lease needs renewing, or the safety poll comes.
type bucketHandler struct {
	q     *DelayQueue
	b     int
	lease bucketLease   // owned by the handler goroutine, and by Close once it has ended
	sig   chan struct{} // buffered: a wake-up is waiting in wakeAt or free

	mu     sync.Mutex
	wakeAt time.Time // the earliest wake-up asked for since the last look
	free   bool      // the lease holder released the lease
	// woke lists the (move mark, topic) pairs whose consumers in this
	// process were woken, by the move's reply or by its message, whichever
	// came first; the other is skipped. At most maxWoke, the oldest
	// forgotten first (order is a ring over them).
	woke  map[wakeKey]struct{}
	order []wakeKey // maxWoke long, made on first use
	next  int

	// Owned by the handler goroutine, and read by Close once it has ended.
	failures int       // consecutive Redis errors
	trimmed  time.Time // when dead letters past their retention were last deleted
	calls    uint64    // move calls made, numbering their marks
	buried   time.Time // when expired tombstones were last deleted
}

type wakeKey struct{ mark, topic string }

// maxWoke bounds the wake-ups a bucket handler remembers: far more than can be on
// their way at once.
const maxWoke = 256

// wokeFromReply reports whether a ready notification of topic, marked by the
// move that sent it, comes from this handler's own move, whose reply woke
// this process's consumers already (see step). The first of the two to come,
// reply or notification, wakes them.
func (h *bucketHandler) wokeFromReply(mark, topic string) bool {
	token, _, _ := strings.Cut(mark, ":")
	return token == h.lease.token && !h.claimWake(mark, topic)
}

// claimWake reports whether the consumers of topic in this process are
// still to be woken for the move marked mark, and records that they are.
func (h *bucketHandler) claimWake(mark, topic string) bool {
	k := wakeKey{mark, topic}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.woke[k]; ok {
		return false
	}
	if h.woke == nil {
		h.woke, h.order = make(map[wakeKey]struct{}, maxWoke), make([]wakeKey, maxWoke)
	}
	delete(h.woke, h.order[h.next]) // the oldest, or the zero key
	h.order[h.next] = k
	h.next = (h.next + 1) % maxWoke
	h.woke[k] = struct{}{}
	return true
}

func newBucketHandler(q *DelayQueue, b int) *bucketHandler {
	return &bucketHandler{q: q, b: b, lease: bucketLease{token: newToken()}, sig: make(chan struct{}, 1)}
}

// wake asks the handler to move jobs after delay, when it holds the lease.
func (h *bucketHandler) wake(delay time.Duration) {
	at := time.Now().Add(delay)
	h.mu.Lock()
	if h.wakeAt.IsZero() || at.Before(h.wakeAt) {
		h.wakeAt = at
	}
	h.mu.Unlock()
	h.signal()
}

// leaseFreed tells a bucket handler without the lease that it may take it now.
func (h *bucketHandler) leaseFreed() {
	h.mu.Lock()
	h.free = true
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

// step moves one batch and returns how long to wait before the next.
func (h *bucketHandler) step(ctx context.Context) time.Duration {
	log := h.q.opts.logger
	h.calls++
	// Tombstones whose dedup window ended go at most once a second, and at
	// least once per step of an idle handler.
	trim := time.Since(h.buried) >= time.Second
	res, err := h.q.moveDue(ctx, h.b, h.lease.token, h.calls, trim)
	if err == nil && trim && !res.contended {
		h.buried = time.Now()
	}
	if err != nil {
		if ctx.Err() != nil {
			return 0
		}
		h.lease.held = false
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
	if h.failures > 0 || (h.lease.held && res.fresh) {
		h.q.restoreRecord(ctx)
	}
	if h.failures > 0 {
		log.Info("delayqueue: bucket handler moves due jobs again", attrBucket, h.b, "failures", h.failures)
		h.failures = 0
	}
	if res.contended {
		return h.lease.contended(res.held, h.q.opts.lease)
	}
	h.lease.held = true
	if res.moved > 0 {
		log.Debug("delayqueue: moved due jobs", attrBucket, h.b, "moved", res.moved)
	}
	// Wake this process's consumers now, not a pub/sub round trip later;
	// the notifier skips the message that says the same, and this skips
	// what the message said first.
	for _, r := range res.ready {
		if h.claimWake(res.mark, r.topic) {
			h.q.notifyReady(h.b, r)
		}
		h.q.observe(ctx, Event{Kind: EventMoved, Topic: r.topic, Count: r.count})
	}
	if h.q.opts.retention > 0 && time.Since(h.trimmed) >= h.q.opts.poll {
		h.trimmed = time.Now()
		if n, err := h.q.trimDead(ctx, h.b); err != nil {
			log.Warn("delayqueue: cannot delete expired dead letters", attrBucket, h.b, attrError, err)
		} else if n > 0 {
			log.Debug("delayqueue: deleted expired dead letters", attrBucket, h.b, "deleted", n)
		}
	}
	if res.moved >= h.q.opts.batch {
		return 0 // a backlog: drain it batch by batch
	}
	wait := min(renewWithin(h.q.opts.lease), h.q.opts.poll)
	if res.next >= 0 && res.next < wait {
		wait = res.next
	}
	return wait
}

// sleep waits for wait, or less when woken for an earlier due job (or, when
// the handler has no lease, for a freed lease). It returns false when ctx
// ends.
func (h *bucketHandler) sleep(ctx context.Context, timer *time.Timer, wait time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	deadline := time.Now().Add(wait)
	timer.Reset(wait)
	for {
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
			return true
		case <-h.sig:
			h.mu.Lock()
			at, free := h.wakeAt, h.free
			h.wakeAt, h.free = time.Time{}, false
			h.mu.Unlock()
			if !h.lease.held {
				if free {
					return true
				}
				continue
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

// release gives up the lease at Close, if this bucket handler holds it.
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
