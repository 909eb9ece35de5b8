package delayqueue

import (
	"slices"
	"sync"
	"time"
)

// The consumers of a process waiting for a topic, and how wake-ups reach
// them: the notifier (notify.go) hands each ready notification to the
// topic's watch, which wakes as many waiting Pops as jobs became ready.

// topicWatch tracks, for one topic in this process, how many jobs each
// bucket's ready list holds as far as the notifications tell, and the Pops
// waiting for one. A notification that n jobs became ready in a bucket adds
// n to its count and wakes n waiting Pops, oldest first; a Pop takes from
// the count what it asks the bucket for (take), so that sixteen Pops do not
// all look at a list that got one job. A look that finds the list empty sets
// the count to zero, unless a notification came in the meantime. The count
// is unknown (every Pop may look) at first, after a safety poll, and when
// the pub/sub connection was re-established: notifications may have been
// lost.
type topicWatch struct {
	mu        sync.Mutex
	ready     []int    // per bucket: jobs ready and not taken by a look; unknown for "look"
	version   []uint64 // bumped on every notification of the bucket
	waiters   []*waiter
	rechecked time.Time // the last safety poll (or the watch's start)
}

// unknown is a bucket's ready count when a look must find it out.
const unknown = -1

// maxCount bounds a ready count: a notification of more is as good as
// unknown.
const maxCount = 1 << 30

// waiter is one Pop of the topic. It is in waiters from its look at the
// buckets until it is woken.
type waiter struct {
	wake chan struct{} // buffered; holds a wake-up not yet taken
	hint int           // the bucket it was woken for, looked at first; -1 for none
}

func newWaiter() *waiter { return &waiter{wake: make(chan struct{}, 1), hint: -1} }

func newTopicWatch(buckets int) *topicWatch {
	w := &topicWatch{ready: make([]int, buckets), version: make([]uint64, buckets), rechecked: time.Now()}
	for b := range w.ready {
		w.ready[b] = unknown
	}
	return w
}

// notify records that n jobs became ready in bucket b and wakes n waiters.
func (w *topicWatch) notify(b, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if b < 0 || b >= len(w.version) {
		return // from a queue opened with more buckets: ignored
	}
	w.version[b]++
	n = max(n, 1)
	switch {
	case w.ready[b] == unknown || w.ready[b]+n >= maxCount:
		w.ready[b] = unknown
	default:
		w.ready[b] += n
	}
	w.wakeLocked(n, b)
}

// pollDue rechecks every bucket when the last recheck was poll ago or
// more: a job whose notification was lost (a full client buffer, a script
// cut short) is found then, at the latest.
func (w *topicWatch) pollDue(poll time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if time.Since(w.rechecked) >= poll {
		w.recheckLocked()
	}
}

// recheckLocked makes every bucket's count unknown and wakes every waiter.
func (w *topicWatch) recheckLocked() {
	w.rechecked = time.Now()
	for b := range w.version {
		w.version[b]++
		w.ready[b] = unknown
	}
	w.wakeLocked(len(w.waiters), -1)
}

// wakeLocked wakes the n oldest waiters for bucket b (-1: any bucket).
func (w *topicWatch) wakeLocked(n, b int) {
	n = min(n, len(w.waiters))
	for _, wt := range w.waiters[:n] {
		wt.hint = b
		select {
		case wt.wake <- struct{}{}:
		default: // cannot happen: a woken waiter leaves the list until it drains
		}
	}
	w.waiters = slices.Delete(w.waiters, 0, n)
}

// candidates lists the buckets that may hold ready jobs not taken by a
// look (every bucket when all is set), starting at a rotating offset so that
// consumers spread over buckets, but with the bucket wt was woken for
// first. It (re)enlists wt as a waiter, so that a notification from now on
// wakes it.
func (w *topicWatch) candidates(start int, all bool, wt *waiter) []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-wt.wake: // a wake-up that came during the last look: this look serves it
	default:
	}
	if !slices.Contains(w.waiters, wt) {
		w.waiters = append(w.waiters, wt)
	}
	n := len(w.version)
	var buckets []int
	for i := -1; i < n; i++ {
		b := (start + i) % n
		switch {
		case i < 0 && wt.hint < 0:
			continue
		case i < 0:
			b = wt.hint
		case b == wt.hint:
			continue
		}
		if all || w.ready[b] != 0 {
			buckets = append(buckets, b)
		}
	}
	wt.hint = -1
	return buckets
}

// look is a Pop's look at one bucket: it asks for n jobs, and took credit
// of the bucket's count.
type look struct {
	b, n    int
	credit  int
	version uint64
}

// take plans a look at bucket b for up to want jobs. A bucket whose count
// is known is asked for no more than its count (n is 0 when it has none
// left); all asks every bucket for want.
func (w *topicWatch) take(b, want int, all bool) look {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := look{b: b, n: want, version: w.version[b]}
	if c := w.ready[b]; c != unknown {
		l.credit = min(c, want)
		w.ready[b] -= l.credit
		if !all {
			l.n = l.credit
		}
	}
	return l
}

// settle records what a look found: got jobs, and how the call ended (err
// when it failed, and nothing is known).
func (w *topicWatch) settle(l look, got int, status reserveStatus, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err != nil || status == onlyStale:
		// The list may still hold what the look took credit for: give
		// it back, and to a waiter.
		if back := l.credit - min(got, l.credit); back > 0 {
			if w.ready[l.b] != unknown {
				w.ready[l.b] += back
			}
			w.wakeLocked(back, l.b)
		}
	case status == listEmpty && w.version[l.b] == l.version:
		w.ready[l.b] = 0
	}
}

// leave takes a returning Pop off the waiters. A wake-up it was given and
// did not act on goes to the next waiter.
func (w *topicWatch) leave(wt *waiter) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if i := slices.Index(w.waiters, wt); i >= 0 {
		w.waiters = slices.Delete(w.waiters, i, i+1)
		return
	}
	select {
	case <-wt.wake:
		w.wakeLocked(1, wt.hint)
	default:
	}
}

// notifyReady wakes this process's consumers for jobs of one topic that
// became ready in bucket b.
func (q *DelayQueue) notifyReady(b int, ready topicCount) {
	q.mu.Lock()
	n := q.notes
	q.mu.Unlock()
	if n == nil {
		return // nobody here pops
	}
	n.wakeReady(b, ready.topic, ready.count)
}
