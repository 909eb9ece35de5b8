package delayqueue

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Stats counts a queue's jobs, summed over its buckets.
type Stats struct {
	// Jobs is every job in the queue, of every topic and state.
	Jobs int
	// Scheduled is the delayed and reserved jobs of every topic: those
	// waiting in the buckets for a due time or a reservation deadline.
	Scheduled int
	// Ready is the length of the topic's ready lists. The ID of a ready job
	// removed or rescheduled counts until a consumer drops it.
	Ready int
	// Dead is the topic's dead letters.
	Dead int
}

// Stats reads the queue's counts for topic in one pipeline: O(1) per
// bucket. It returns ErrInvalidTopic for a bad topic.
//
// Deprecated: Stats mixes figures of the whole queue (Jobs, Scheduled) with
// the topic's (Ready, Dead), and Ready counts IDs left in the list by jobs
// no longer ready. Use Counts for a topic and Overview for the queue.
func (q *DelayQueue) Stats(ctx context.Context, topic string) (Stats, error) {
	if err := q.checkTopic(topic); err != nil {
		return Stats{}, err
	}
	pipe := q.client.Pipeline()
	cmds := make([][4]*redis.IntCmd, q.opts.buckets)
	for b := range cmds {
		bk := q.keys.bucket(b)
		cmds[b] = [4]*redis.IntCmd{
			pipe.HLen(ctx, bk.pool), pipe.ZCard(ctx, bk.zset),
			pipe.LLen(ctx, bk.ready(topic)), pipe.ZCard(ctx, bk.dead(topic)),
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		q.noteError(ctx, err)
		return Stats{}, fmt.Errorf("delayqueue: stats: %w", err)
	}
	var s Stats
	for _, c := range cmds {
		s.Jobs += int(c[0].Val())
		s.Scheduled += int(c[1].Val())
		s.Ready += int(c[2].Val())
		s.Dead += int(c[3].Val())
	}
	return s, nil
}
