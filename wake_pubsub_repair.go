package delayqueue

import (
	"log/slog"
	"slices"
	"time"
)

// Keeping the notifier's subscriptions alive: a probe of one gone silent,
// and subscribing again when Redis refuses one or its slot moves.

// pongWait is how long a ping may go unanswered before its subscription
// is replaced: as long as the client waits for any reply (ReadTimeout),
// and no longer than the health check interval.
func (n *notifier) pongWait() time.Duration {
	idle := max(n.env.poll, time.Second)
	if n.env.readTimeout > 0 {
		return min(n.env.readTimeout, idle)
	}
	return idle
}

// probe pings every subscription in use, once at a time each, and replaces
// one that has heard nothing by the time the client stops waiting for a
// reply: a command that timed out says the link may have gone silent, the
// subscriptions' too, and an idle subscription would otherwise not notice
// before its health check.
func (n *notifier) probe() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	for _, sub := range n.subs {
		if sub.done == nil || !sub.probing.CompareAndSwap(false, true) {
			continue
		}
		n.moves.Add(1)
		go func() {
			defer n.moves.Done()
			defer sub.probing.Store(false)
			sent := time.Now().UnixNano()
			if err := sub.ps.Ping(n.ctx); err != nil {
				return // a write that fails has go-redis dial again
			}
			if n.pause(n.pongWait()) && sub.heard.Load() < sent {
				n.env.logger.Debug("delayqueue: no answer on a subscription after a command timed out; subscribing again")
				n.replace(sub, 0)
			}
		}()
	}
}

// resync has everyone behind the subscription's channels look at Redis
// again, as a confirmation does.
func (n *notifier) resync(sub *subscription) {
	n.mu.Lock()
	channels := make([]string, 0, len(sub.confirmed))
	for ch := range sub.confirmed {
		channels = append(channels, ch)
	}
	n.mu.Unlock()
	for _, ch := range channels {
		n.dispatch(ch, "", true)
	}
}

// pause waits for d, and reports false when the notifier closes first.
func (n *notifier) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-n.ctx.Done():
		return false
	}
}

// warnRefusals is how many refusals in a row of a subscription's channels
// are logged as a warning, and again at each power of it (a refusal that
// lasts, such as NOAUTH, says so now and then): the first ones are the
// normal course after a slot moved, until go-redis has learnt its new
// owner.
const warnRefusals = 8

// refused replaces a subscription that Redis refused (err): sent to a node
// that does not own its slot, say.
func (n *notifier) refused(sub *subscription, err error) {
	n.mu.Lock()
	refusals := sub.refusals + 1
	n.mu.Unlock()
	level := slog.LevelDebug
	for w := warnRefusals; w <= refusals; w *= warnRefusals {
		if w == refusals { // at 8, 64, 512, ... refusals in a row
			level = slog.LevelWarn
		}
	}
	attrs := []any{attrError, err, "refusals", refusals}
	if n.env.sharded {
		attrs = append(attrs, attrBucket, sub.key)
	}
	n.env.logger.Log(n.ctx, level, "delayqueue: Redis refused a subscription; subscribing again", attrs...)
	n.replace(sub, refusals)
}

// replace takes a subscription out of use and subscribes to its channels
// anew, in the background, once the client has been asked to learn where
// their slot is now: after a short wait when the slot moved (refusals is 0),
// longer the more often Redis refused them in a row. Redis's confirmation
// of the new subscription makes everyone behind its channels look at Redis
// again; a refusal of it, or another move, replaces it in turn, until the
// notifier closes.
func (n *notifier) replace(sub *subscription, refusals int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || sub.dropped {
		return
	}
	n.dropLocked(sub)
	channels := map[string]route{}
	for ch := range sub.confirmed { // a Pop may have added a topic since it was sent
		channels[ch] = n.routes[ch]
	}
	n.moves.Add(1)
	go func() {
		defer n.moves.Done()
		_ = sub.closePS()
		n.env.slotMoved(n.ctx) // in the background: give it time
		if n.pause(retryBackoff(refusals + 1)) {
			_, _ = n.send(channels, refusals) // fails only when closed
		}
	}()
}

// dropLocked takes a subscription out of use. Whoever still waits for one of
// its channels to be confirmed goes on: the safety poll, and the look that
// follows the new subscription, cover what it may miss.
func (n *notifier) dropLocked(sub *subscription) {
	sub.dropped = true
	if n.subs[sub.key] == sub {
		delete(n.subs, sub.key)
	}
	// Forget those dropped before whose readers have returned.
	n.dropped = slices.DeleteFunc(n.dropped, func(d *subscription) bool {
		if d.done == nil {
			return false
		}
		select {
		case <-d.done:
			return true
		default:
			return false
		}
	})
	n.dropped = append(n.dropped, sub)
	for _, c := range sub.confirmed {
		select {
		case <-c:
		default:
			close(c)
		}
	}
}
