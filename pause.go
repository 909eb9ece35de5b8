package delayqueue

import (
	"context"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"
)

// Pausing a topic. Every bucket keeps the set of paused topics
// (dq:{name:b}:paused), and the script that reserves jobs reads it, so a
// pause holds in every process from the moment Pause returns, with no
// command per job and none for a process that only pushes. A process
// learns of a pause from its next reserve call's reply (the call puts
// back the signals it held and says the topic is paused), and its
// consumers then wait without a blocked call for the topic. Resume tells
// every process on the control channel, so that their consumers look
// again at once. A pause is not told: told by one process while another
// resumes the topic, it could arrive after the resume and leave the
// processes waiting on a topic that Redis holds resumed.

// Pause stops delivering topic's jobs, in every process, once it returns:
// due jobs still move to ready, but Pop waits (and a Pop that does not wait
// returns ErrNoJob) and Consume idles until Resume. Jobs already reserved
// are not affected. Pausing a paused topic changes nothing.
func (q *DelayQueue) Pause(ctx context.Context, topic string) error {
	if err := q.checkTopic(topic); err != nil {
		return err
	}
	if err := q.eachBucketSet(ctx, topic, true); err != nil {
		return fmt.Errorf("delayqueue: pause %q: %w", topic, err)
	}
	return nil
}

// Resume delivers topic's jobs again, at once: waiting consumers in every
// process are woken. Resuming a topic that is not paused changes nothing.
func (q *DelayQueue) Resume(ctx context.Context, topic string) error {
	if err := q.checkTopic(topic); err != nil {
		return err
	}
	if err := q.eachBucketSet(ctx, topic, false); err != nil {
		return fmt.Errorf("delayqueue: resume %q: %w", topic, err)
	}
	q.announce(ctx, controlResume+topic)
	return nil
}

// eachBucketSet adds topic to every bucket's paused set, or removes it.
func (q *DelayQueue) eachBucketSet(ctx context.Context, topic string, add bool) error {
	pipe := q.client.Pipeline()
	for b := range q.opts.buckets {
		if add {
			pipe.SAdd(ctx, q.keys.bucket(b).paused, topic)
		} else {
			pipe.SRem(ctx, q.keys.bucket(b).paused, topic)
		}
	}
	_, err := pipe.Exec(ctx)
	if err != nil {
		q.noteError(ctx, err)
	}
	return redisError(err)
}

// pausedTopics lists the paused topics, sorted.
func (q *DelayQueue) pausedTopics(ctx context.Context) ([]string, error) {
	pipe := q.client.Pipeline()
	cmds := make([]*redis.StringSliceCmd, q.opts.buckets)
	for b := range cmds {
		cmds[b] = pipe.SMembers(ctx, q.keys.bucket(b).paused)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		q.noteError(ctx, err)
		return nil, fmt.Errorf("delayqueue: paused topics: %w", err)
	}
	var topics []string
	for _, c := range cmds {
		topics = append(topics, c.Val()...)
	}
	slices.Sort(topics)
	return slices.Compact(topics), nil
}
