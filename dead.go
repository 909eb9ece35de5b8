package delayqueue

import (
	"context"
	"fmt"
)

// Dead letters: a job whose attempts ran out waits in its topic's dead-letter
// set of its bucket, scored by when it died, until it is requeued, removed,
// purged, or older than the retention set by WithDeadRetention. It is never
// dropped otherwise.

// deadBatch bounds how many dead jobs one script call handles.
const deadBatch = 500

// RequeueDead makes a dead job ready again at once, with its attempts reset.
// It returns ErrNotFound when no dead job has that ID.
func (q *DelayQueue) RequeueDead(ctx context.Context, id string) error {
	b, err := q.openBucketOfID(id)
	if err != nil {
		return err
	}
	job, err := q.Get(ctx, id)
	if err != nil {
		return err
	}
	if job.State != StateDead {
		return fmt.Errorf("%w: %q is %s, not dead", ErrNotFound, id, job.State)
	}
	n, err := q.requeue(ctx, b, job.Topic, id)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%w: %q is no longer dead", ErrNotFound, id)
	}
	return nil
}

// RequeueAllDead makes every dead job of topic ready again, with attempts
// reset, and returns how many it requeued.
func (q *DelayQueue) RequeueAllDead(ctx context.Context, topic string) (int, error) {
	if err := q.checkTopic(topic); err != nil {
		return 0, err
	}
	return q.eachBucketBatch(func(b int) (int, error) { return q.requeue(ctx, b, topic, "") })
}

// PurgeDead deletes every dead job of topic and returns how many it deleted.
func (q *DelayQueue) PurgeDead(ctx context.Context, topic string) (int, error) {
	if err := q.checkTopic(topic); err != nil {
		return 0, err
	}
	return q.eachBucketBatch(func(b int) (int, error) { return q.purge(ctx, b, topic, 0) })
}

// eachBucketBatch runs a batched step on every bucket until it handles less
// than a batch, and adds up what it handled.
func (q *DelayQueue) eachBucketBatch(step func(b int) (int, error)) (int, error) {
	total := 0
	for b := range q.opts.buckets {
		for {
			n, err := step(b)
			total += n
			if err != nil {
				return total, err
			}
			if n < deadBatch {
				break
			}
		}
	}
	return total, nil
}

func (q *DelayQueue) requeue(ctx context.Context, b int, topic, id string) (int, error) {
	bk := q.keys.bucket(b)
	n, err := q.run(ctx, b, scriptRequeue, []string{bk.deadPrefix, bk.pool, bk.readyPrefix, bk.deadTopics, bk.counts, bk.sigPrefix},
		deadBatch, id, topic).Int()
	if err != nil {
		return 0, fmt.Errorf("delayqueue: requeue dead jobs of %q in bucket %d: %w", topic, b, err)
	}
	return n, nil
}

// purge deletes a batch of topic's dead jobs of bucket b that died at least
// ageMs ago.
func (q *DelayQueue) purge(ctx context.Context, b int, topic string, ageMs int64) (int, error) {
	bk := q.keys.bucket(b)
	n, err := q.run(ctx, b, scriptPurge, []string{bk.dead(topic), bk.pool, bk.deadTopics, bk.dedup},
		topic, ageMs, deadBatch).Int()
	if err != nil {
		return 0, fmt.Errorf("delayqueue: purge dead jobs of %q in bucket %d: %w", topic, b, err)
	}
	return n, nil
}

// maxTrimBatches bounds how many batches of a topic's dead jobs one look
// of trimDead deletes in a bucket: deadBatch times as many, and a call
// each, between two moves of the bucket handler.
const maxTrimBatches = 20

// trimDead deletes bucket b's dead jobs older than the retention, up to
// maxTrimBatches batches per topic. The bucket handler calls it.
func (q *DelayQueue) trimDead(ctx context.Context, b int) (int, error) {
	topics, err := q.client.SMembers(ctx, q.keys.bucket(b).deadTopics).Result()
	if err != nil {
		return 0, fmt.Errorf("delayqueue: dead topics of bucket %d: %w", b, err)
	}
	total := 0
	for _, topic := range topics {
		for range maxTrimBatches {
			n, err := q.purge(ctx, b, topic, q.opts.retention.Milliseconds())
			total += n
			if err != nil {
				return total, err
			}
			if n < deadBatch {
				break
			}
		}
	}
	return total, nil
}
