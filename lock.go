package delayqueue

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Each bucket has a lease: a string key (dq:{name:b}:lock) holding the
// token of the bucket handler that may move its jobs, with an expiry
// (WithLease). The whole of it:
//   - move.lua takes a free lease or extends the caller's own as part of
//     every move (moveDue, in bucket.go, passes the token and reads back
//     whether another process holds it, and for how long), so a bucket
//     bucket handler renews its lease simply by working, and by looking at its
//     bucket at least every renewWithin when idle;
//   - a bucket handler that finds it held tries again when it would run out
//     (contended), or when its holder releases it;
//   - unlock.lua gives it up at Close and publishes "free" on the bucket's
//     wake channel, which wakes the other processes' bucket handlers.
// Both scripts check the token, so a bucket handler whose lease ran out and
// passed to another process can neither renew nor release it.
//
// The lease keeps one mover per bucket to save work; correctness does not
// depend on it, because each move is atomic.

// bucketLease is a bucket handler's side of its bucket's lease.
type bucketLease struct {
	token string // this bucket handler's, for as long as it lives
	held  bool   // the last move held the lease
}

// contended records that another process holds the lease for held more,
// and returns when to try again: when that lease would run out, unless
// renewed, with jitter so that contenders do not try in step. A released
// lease wakes the bucket handler earlier ("free" on the wake channel).
func (l *bucketLease) contended(held, lease time.Duration) time.Duration {
	l.held = false
	return held + rand.N(lease/10+time.Millisecond)
}

// renewWithin is how long a holder may sleep and keep its lease: a third of
// it, so that a late wake-up or a slow round trip does not lose it.
func renewWithin(lease time.Duration) time.Duration { return lease / 3 }

// release gives the lease of bucket b up, if held, and tells the other
// processes' bucket handlers that it is free.
func (l *bucketLease) release(ctx context.Context, q *DelayQueue, b int) error {
	if !l.held {
		return nil
	}
	l.held = false
	_, err := q.unlock(ctx, b, l.token)
	return err
}

// newToken returns a random lease token.
func newToken() string {
	var b [16]byte
	_, _ = crand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// unlock releases bucket b's lease if token still holds it, and tells the
// other processes' bucket handlers that it is free. It reports whether it did.
func (q *DelayQueue) unlock(ctx context.Context, b int, token string) (bool, error) {
	bk := q.keys.bucket(b)
	r, err := q.run(ctx, b, scriptUnlock, []string{bk.lock}, token, bk.wake, q.pub).Int64()
	if err != nil {
		return false, fmt.Errorf("delayqueue: release lease of bucket %d: %w", b, err)
	}
	return r == 1, nil
}

// startWatch notices consumers that wait on a queue no process has
// started: their delayed jobs would never become ready, silently.
type startWatch struct {
	mu        sync.Mutex
	checked   time.Time // the last look at the leases
	noneSince time.Time // zero while some bucket had a holder at the last look
	warned    bool      // since the last time a holder was seen
	looks     int       // looks taken, for tests
}

// checkStarted runs when a waiting Pop reaches a safety poll. At most once
// per poll, unless this process runs the bucket handlers itself, it looks
// whether any bucket's lease is held; when none has been held for a poll
// or longer, it logs a warning that names the fix, once until a holder
// appears.
func (q *DelayQueue) checkStarted(ctx context.Context) {
	q.mu.Lock()
	started := q.started
	q.mu.Unlock()
	s := &q.startWatch
	s.mu.Lock()
	if started || time.Since(s.checked) < q.opts.poll {
		s.mu.Unlock()
		return
	}
	s.checked = time.Now()
	s.looks++
	s.mu.Unlock()
	held, err := q.anyLeaseHeld(ctx)
	if err != nil {
		q.opts.logger.Debug("delayqueue: cannot look at the bucket leases", attrError, err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	switch {
	case held:
		s.noneSince, s.warned = time.Time{}, false
	case s.noneSince.IsZero():
		s.noneSince = now
	case !s.warned && now.Sub(s.noneSince) >= q.opts.poll:
		s.warned = true
		q.opts.logger.Warn("delayqueue: consumers wait, but no process has started this queue: "+
			"jobs pushed with a delay never become ready until one does; call Start in at least one process, such as every worker",
			"queue", q.opts.name, "for", now.Sub(s.noneSince).Round(time.Millisecond))
	}
}

// anyLeaseHeld reports whether any bucket's lease has a holder.
func (q *DelayQueue) anyLeaseHeld(ctx context.Context) (bool, error) {
	pipe := q.client.Pipeline()
	cmds := make([]*redis.IntCmd, q.opts.buckets)
	for b := range cmds {
		cmds[b] = pipe.Exists(ctx, q.keys.bucket(b).lock)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return false, fmt.Errorf("delayqueue: look at the bucket leases: %w", err)
	}
	for _, c := range cmds {
		if c.Val() > 0 {
			return true, nil
		}
	}
	return false, nil
}
