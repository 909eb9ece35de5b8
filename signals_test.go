package delayqueue

// waitersOf counts the consumers of q waiting for topic.
func waitersOf(q *DelayQueue, topic string) int {
	q.mu.Lock()
	w := q.waits
	q.mu.Unlock()
	if w == nil {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if tw := w.topics[topic]; tw != nil {
		return len(tw.waiters)
	}
	return 0
}

// blockedFor reports whether every blocked call of q waits for topic.
func blockedFor(q *DelayQueue, topic string) bool {
	q.mu.Lock()
	w := q.waits
	q.mu.Unlock()
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, g := range w.groups {
		if g.keys == nil || !g.waitsFor(topic) {
			return false
		}
	}
	return true
}
