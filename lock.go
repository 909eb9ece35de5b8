package delayqueue

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"time"
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
