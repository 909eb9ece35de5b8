package delayqueue

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The warning that no process has started the queue: consumers wait, but
// no bucket handler holds a lease, so delayed jobs never become ready.

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
