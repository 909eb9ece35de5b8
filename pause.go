package delayqueue

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Pausing a topic. The paused topics are a set in Redis (dq:{name}:paused),
// so every process obeys them. A process reads the set at most once per
// pauseRefresh, and only while one of its Pops runs: no command per job,
// and none at all for a process that only pushes. A resume also wakes the
// topic's waiting consumers in every process at once (a "resume" message
// on each bucket's ready channel), which read the set again.

// pauseRefresh bounds how stale a process's view of the paused topics may
// be: a pause is obeyed everywhere within it.
const pauseRefresh = 500 * time.Millisecond

// pauses is this process's view of the paused topics.
type pauses struct {
	mu       sync.Mutex
	topics   map[string]bool
	fetched  time.Time // zero: read the set again
	fetching bool      // a Pop reads the set now; the others use the view they have
}

// Pause stops delivering topic's jobs, in every process, within a second:
// due jobs still move to ready, but Pop waits (and a Pop that does not wait
// returns ErrNoJob) and Consume idles until Resume. Jobs already reserved
// are not affected. Pausing a paused topic changes nothing.
func (q *DelayQueue) Pause(ctx context.Context, topic string) error {
	if err := q.checkTopic(topic); err != nil {
		return err
	}
	if err := q.client.SAdd(ctx, q.keys.paused(), topic).Err(); err != nil {
		return fmt.Errorf("delayqueue: pause %q: %w", topic, redisError(err))
	}
	q.pauses.invalidate()
	return nil
}

// Resume delivers topic's jobs again, at once: waiting consumers in every
// process are woken. Resuming a topic that is not paused changes nothing.
func (q *DelayQueue) Resume(ctx context.Context, topic string) error {
	if err := q.checkTopic(topic); err != nil {
		return err
	}
	if err := q.client.SRem(ctx, q.keys.paused(), topic).Err(); err != nil {
		return fmt.Errorf("delayqueue: resume %q: %w", topic, redisError(err))
	}
	q.pauses.invalidate()
	pipe := q.client.Pipeline()
	for b := range q.opts.buckets {
		channel := q.keys.bucket(b).readyChannel(topic)
		if q.pub == "SPUBLISH" {
			pipe.SPublish(ctx, channel, resumeMessage)
		} else {
			pipe.Publish(ctx, channel, resumeMessage)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		// Resumed; the waiting consumers see it at their next look.
		q.opts.logger.Warn("delayqueue: resumed, but cannot wake the consumers; they look again within a second",
			attrTopic, topic, attrError, err)
	}
	return nil
}

// PausedTopics lists the paused topics, in no order.
func (q *DelayQueue) PausedTopics(ctx context.Context) ([]string, error) {
	topics, err := q.client.SMembers(ctx, q.keys.paused()).Result()
	if err != nil {
		return nil, fmt.Errorf("delayqueue: paused topics: %w", err)
	}
	return topics, nil
}

// resumeMessage, on a topic's ready channel, says the topic was resumed:
// the notifier resyncs the channel, as after a reconnect.
const resumeMessage = "resume"

// isPaused reports whether topic is paused, as of at most pauseRefresh ago.
func (q *DelayQueue) isPaused(ctx context.Context, topic string) (bool, error) {
	p := &q.pauses
	p.mu.Lock()
	if p.fetching || (!p.fetched.IsZero() && time.Since(p.fetched) < pauseRefresh) {
		// Fresh, or another Pop of this process is reading the set: the
		// view it replaces is at most a round trip staler.
		paused := p.topics[topic]
		p.mu.Unlock()
		return paused, nil
	}
	p.fetching = true
	p.mu.Unlock()
	topics, err := q.PausedTopics(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fetching = false
	if err != nil {
		return false, err
	}
	p.topics, p.fetched = make(map[string]bool, len(topics)), time.Now()
	for _, t := range topics {
		p.topics[t] = true
	}
	return p.topics[topic], nil
}

// invalidate has the next look read the paused topics again.
func (p *pauses) invalidate() {
	p.mu.Lock()
	p.fetched = time.Time{}
	p.mu.Unlock()
}
