package delayqueue

import (
	"sync"
	"sync/atomic"
)

// What a started process counts for the history (history.go) between two
// flushes: the jobs it finished, buried and reserved, per topic, in memory,
// so that the history costs Redis nothing per job.

// doneTally is what a started process counts in memory between two flushes,
// per topic ("" for a job whose topic it does not know). It is safe for
// concurrent use; it counts nothing until Start turns it on.
type doneTally struct {
	on  atomic.Bool
	mu  sync.Mutex
	per map[string]*topicTally
	// busy is signalled when the tally gets its first count since it was
	// taken: a sampler that waits out a quiet queue flushes sooner.
	busy chan struct{}
}

// topicTally is one topic's counts; late and latest are in ms.
type topicTally struct{ finished, died, reservations, late, latest int64 }

// note counts an event of the process.
func (t *doneTally) note(e Event) {
	if !t.on.Load() || (e.Kind != EventFinished && e.Kind != EventDead && e.Kind != EventReserved) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.per == nil {
		t.per = map[string]*topicTally{}
		select {
		case t.busy <- struct{}{}:
		default:
		}
	}
	c := t.per[e.Topic]
	if c == nil {
		c = &topicTally{}
		t.per[e.Topic] = c
	}
	switch e.Kind {
	case EventFinished:
		c.finished++
	case EventDead:
		c.died++
	case EventReserved:
		c.reservations++
		if ms := e.Lateness.Milliseconds(); ms > 0 {
			c.late += ms
			c.latest = max(c.latest, ms)
		}
	}
}

// take returns the counts and starts anew.
func (t *doneTally) take() map[string]*topicTally {
	t.mu.Lock()
	defer t.mu.Unlock()
	per := t.per
	t.per = nil
	return per
}

// restore adds back counts that could not be flushed.
func (t *doneTally) restore(per map[string]*topicTally) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.per == nil {
		t.per = map[string]*topicTally{}
	}
	for topic, c := range per {
		cur := t.per[topic]
		if cur == nil {
			t.per[topic] = c
			continue
		}
		cur.finished += c.finished
		cur.died += c.died
		cur.reservations += c.reservations
		cur.late += c.late
		cur.latest = max(cur.latest, c.latest)
	}
}
