package delayqueue

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Each bucket keeps one ready list per topic. A consumer of a topic pops from
// the lists of every bucket, but only from those that may hold something: the
// movers publish a bucket's number when one of its lists stops being empty,
// and a consumer forgets a bucket once it found its list empty. An idle
// consumer therefore sends Redis nothing but a safety poll.

// staleSkips bounds how many stale IDs one reserve call drops.
const staleSkips = 100

type reserveStatus int

const (
	reserved reserveStatus = iota
	listEmpty
	onlyStale // dropped staleSkips stale IDs; the list may hold more
)

// reserve pops and reserves one ready job of topic from bucket b.
func (q *DelayQueue) reserve(ctx context.Context, b int, topic string) (*Job, reserveStatus, error) {
	bk := q.keys.bucket(b)
	res, err := scriptReserve.Run(ctx, q.client, []string{bk.ready(topic), bk.pool, bk.zset},
		q.keys.wakeChannel(), b, staleSkips).Slice()
	if err != nil {
		return nil, 0, fmt.Errorf("delayqueue: pop %q from bucket %d: %w", topic, b, err)
	}
	if len(res) == 0 {
		return nil, 0, fmt.Errorf("delayqueue: pop %q from bucket %d: empty reply", topic, b)
	}
	switch res[0] {
	case int64(0):
		return nil, listEmpty, nil
	case int64(2):
		return nil, onlyStale, nil
	}
	if len(res) != 3 {
		return nil, 0, fmt.Errorf("delayqueue: pop %q from bucket %d: unexpected reply %v", topic, b, res)
	}
	id, _ := res[1].(string)
	v, _ := res[2].(string)
	job, err := decodeJob(id, []byte(v))
	if err != nil {
		return nil, 0, err
	}
	return job, reserved, nil
}

// Pop reserves the oldest ready job of topic, waiting up to timeout for one
// to become ready; a timeout of zero or less looks once without waiting. The
// job is reserved for its TTR: Finish it before then, or it is delivered
// again. Pop returns ErrNoJob when no job became ready in time, ctx.Err()
// when ctx ends, ErrClosed when the queue is closed, and ErrInvalidTopic for
// a bad topic. While it waits it sends Redis nothing: it is woken by the
// handler that makes a job ready. It is safe for concurrent use.
func (q *DelayQueue) Pop(ctx context.Context, topic string, timeout time.Duration) (*Job, error) {
	if q.closed.Load() {
		return nil, ErrClosed
	}
	if err := validateTopic(topic); err != nil {
		return nil, err
	}
	n, err := q.notifier(ctx)
	if err != nil {
		return nil, err
	}
	w, err := n.watch(ctx, topic)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(timeout)
	var timer *time.Timer
	// A Pop that does not wait looks at every bucket: a notification for a
	// job pushed just before may still be on its way.
	all := timeout <= 0
	for {
		buckets, versions, changed := w.candidates(int(q.rotor.Add(1)), all)
		again := false
		for i, b := range buckets {
			job, status, err := q.reserve(ctx, b, topic)
			if err != nil {
				return nil, err
			}
			switch status {
			case reserved:
				return job, nil
			case listEmpty:
				w.forget(b, versions[i])
			case onlyStale:
				again = true
			}
		}
		if again {
			continue
		}
		remaining := time.Until(deadline)
		if remaining <= 0 {
			return nil, ErrNoJob
		}
		wait := min(remaining, q.opts.poll)
		if timer == nil {
			timer = time.NewTimer(wait)
			defer timer.Stop()
		} else {
			timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-q.done:
			return nil, ErrClosed
		case <-changed:
		case <-timer.C:
			if wait < remaining {
				w.recheckAll() // safety poll
			}
		}
	}
}

// topicWatch tracks, for one topic in this process, which buckets may hold
// ready jobs. A bucket may hold some when it was notified (or never looked
// at) since it was last found empty.
type topicWatch struct {
	mu      sync.Mutex
	version []uint64 // bumped on every notification of the bucket
	empty   []uint64 // the version at which the bucket was found empty
	changed chan struct{}
}

func newTopicWatch(buckets int) *topicWatch {
	w := &topicWatch{
		version: make([]uint64, buckets),
		empty:   make([]uint64, buckets),
		changed: make(chan struct{}),
	}
	for b := range w.version {
		w.version[b] = 1
	}
	return w
}

// notify marks bucket b as maybe holding ready jobs and wakes waiting Pops.
func (w *topicWatch) notify(b int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if b >= 0 && b < len(w.version) {
		w.version[b]++
		w.broadcastLocked()
	}
}

// recheckAll marks every bucket as maybe holding ready jobs.
func (w *topicWatch) recheckAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for b := range w.version {
		w.version[b]++
	}
	w.broadcastLocked()
}

func (w *topicWatch) broadcastLocked() {
	close(w.changed)
	w.changed = make(chan struct{})
}

// candidates lists the buckets that may hold ready jobs (every bucket when
// all is set), starting at a rotating offset so that consumers spread over
// buckets, with their versions and a channel closed at the next notification.
func (w *topicWatch) candidates(start int, all bool) ([]int, []uint64, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(w.version)
	var buckets []int
	var versions []uint64
	for i := range n {
		b := (start + i) % n
		if all || w.version[b] != w.empty[b] {
			buckets = append(buckets, b)
			versions = append(versions, w.version[b])
		}
	}
	return buckets, versions, w.changed
}

// forget records that bucket b was found empty at version v; a notification
// since then keeps it a candidate.
func (w *topicWatch) forget(b int, v uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.version[b] == v {
		w.empty[b] = v
	}
}
