package delayqueue

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"
)

// Each bucket has a lease: a string key (dq:{name:b}:lock) holding the
// token of the bucket handler that moves its jobs, and its lease
// (WithLease) as the key's expiry, a standby lease (dq:{name:b}:standby)
// held so by one other bucket handler, ready to take the bucket over, and
// a second standby lease (dq:{name:b}:second) held by a third, ready to
// stand by in the standby's place. The whole of it:
//   - move.lua takes a free lease or extends the caller's own as part of
//     every move (moveDue, in bucket.go), so a holder renews its lease
//     simply by working, and by looking at its bucket at least every
//     renewWithin when idle;
//   - a caller that finds the lease held takes or keeps the standby lease
//     in the same call, when it is free or its own (or else the second
//     standby lease, when that is free or its own). The standby looks at
//     the bucket when its next job is due, plus takeoverGrace; when a job
//     is overdue by that much and the holder has moved nothing for as long
//     (it died, or froze), the standby takes the bucket over: a crash costs
//     the due jobs about takeoverGrace, not the rest of the lease. While
//     all are healthy, the standby moves nothing: it looks when jobs fall
//     due, and at least every renewWithin, and each look renews the standby
//     lease and writes in it when the standby will look next. Woken for a
//     job due over replanBy before that, it looks at once, and has the
//     second standby told ("sooner:<b>" on the control channel), which
//     planned its own look by the announced one;
//   - the holder, at its chores (about once a second), frees the lease of
//     a standby, or second standby, that has not looked a second after it
//     said it would: it died or froze, and should the holder die next, the
//     bucket would wait for the dead standby's lease to run out;
//   - the second standby looks when the standby would be a tenth of a
//     second late (and at least every renewWithin), and renews its lease
//     so. It stands by in place of a standby that is that late while a
//     job is overdue by takeoverGrace and the holder silent as long, and
//     then takes the bucket over in the same call: holder and standby
//     dying together (two processes on one machine) cost the due jobs
//     about takeoverGrace and a tenth of a second, not the rest of the
//     standby's lease. While the holder moves, it waits until the standby
//     is a second late, as the holder would;
//   - the others try again when the second standby lease would run out
//     (the standby's place goes to the second standby), or when told that
//     one is free (contended, and "standby:<b>" on the control
//     channel, from the process that freed it);
//   - unlock.lua gives all three up at Close, and publishes "free" on the
//     bucket's wake channel, which wakes the standby: it takes the bucket
//     over at once.
// Both scripts check the token, so a bucket handler whose lease ran out and
// passed to another process can neither renew nor release it.
//
// The lease keeps one mover per bucket to save work; correctness does not
// depend on it, because each move is atomic.

// takeoverGrace is how long a job may be overdue, with the holder silent
// as long, before the standby takes its bucket over.
const takeoverGrace = 300 * time.Millisecond

// leaseRole is what a bucket handler is to its bucket.
type leaseRole int

const (
	roleNone    leaseRole = iota // others hold the lease and both standby leases
	roleHolder                   // it holds the lease, and moves the bucket's jobs
	roleStandby                  // it stands by, to take the bucket over
	roleSecond                   // it stands by to take the standby's place
)

// watches reports whether the role looks at the bucket's jobs: the
// holder's and the standby's.
func (r leaseRole) watches() bool { return r == roleHolder || r == roleStandby }

// bucketLease is a bucket handler's side of its bucket's leases.
type bucketLease struct {
	token string    // this bucket handler's, for as long as it lives
	role  leaseRole // as the last move said
}

// contended records that other processes hold the three leases, the
// second standby's for wait more, and returns when to try again: when that
// lease would run out, unless renewed, with jitter so that contenders do
// not try in step. A vacancy wakes the bucket handler earlier.
func (l *bucketLease) contended(wait, lease time.Duration) time.Duration {
	l.role = roleNone
	return wait + rand.N(lease/10+time.Millisecond)
}

// renewWithin is how long a holder may sleep and keep its lease: a third of
// it, so that a late wake-up or a slow round trip does not lose it.
func renewWithin(lease time.Duration) time.Duration { return lease / 3 }

// release gives the leases of bucket b up, if held: the standby hears that
// the lease is free and takes the bucket over, and the others that a
// standby lease is.
func (l *bucketLease) release(ctx context.Context, q *DelayQueue, b int) error {
	role := l.role
	if role == roleNone {
		return nil
	}
	l.role = roleNone
	if _, err := q.unlock(ctx, b, l.token); err != nil {
		return err
	}
	if role == roleStandby || role == roleSecond {
		q.announce(ctx, controlStandby+strconv.Itoa(b))
	}
	return nil
}

// newToken returns a random lease token.
func newToken() string {
	var b [16]byte
	_, _ = crand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// unlock releases bucket b's leases that token still holds, telling the
// standby when the lease is free. It reports whether it released the lease.
func (q *DelayQueue) unlock(ctx context.Context, b int, token string) (bool, error) {
	bk := q.keys.bucket(b)
	r, err := q.run(ctx, b, scriptUnlock, []string{bk.lock, bk.standby, bk.second}, token, bk.wake, q.pub).Int64()
	if err != nil {
		return false, fmt.Errorf("delayqueue: release lease of bucket %d: %w", b, err)
	}
	return r == unlockReleased, nil
}
