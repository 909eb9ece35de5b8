package delayqueue

// TEMP stub: the inspection calls another engineer is adding on main, with
// their exact signatures, so that dqprom builds against them now. Drop this
// file when merging main.

import (
	"context"
	"time"
)

// Counts says how many jobs of a topic are in each state.
type Counts struct {
	Delayed, Ready, Reserved, Dead int
	// OldestReady is how long the oldest ready job has waited since it was
	// due (server clock); zero when none is ready.
	OldestReady time.Duration
}

// Overview is the queue's figures at one moment: per topic, and queue-wide apart.
type Overview struct {
	Topics  map[string]Counts // every topic with a job in any state, or paused
	Total   Counts            // sums over topics; OldestReady is the largest
	Jobs    int               // jobs in the job pool, every state and topic
	Paused  []string          // paused topics, sorted
	Buckets int
}

// Overview reads the figures in one round trip per bucket (bounded: O(topics) per bucket).
// TEMP stub: returns zero values.
func (q *DelayQueue) Overview(ctx context.Context) (Overview, error) {
	return Overview{}, nil
}
