package delayqueue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

// Each bucket has a lease: a string key holding the token of the handler
// that may move its jobs, with an expiry. move.lua takes a free lease or
// extends the caller's own as part of every move, so a handler renews its
// lease simply by working (and by its idle safety poll); unlock.lua gives it
// up. Both check the token inside the script, so a handler whose lease ran
// out and passed to another process can neither renew nor release it.
//
// The lease keeps one mover per bucket to save work; correctness does not
// depend on it, because each move is atomic.

// newToken returns a random lease token.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// unlock releases bucket b's lease if token still holds it, and tells the
// other processes' handlers that it is free. It reports whether it did.
func (q *DelayQueue) unlock(ctx context.Context, b int, token string) (bool, error) {
	bk := q.keys.bucket(b)
	r, err := q.run(ctx, b, scriptUnlock, []string{bk.lock}, token, bk.wake, q.pub).Int64()
	if err != nil {
		return false, fmt.Errorf("delayqueue: release lease of bucket %d: %w", b, err)
	}
	return r == 1, nil
}
