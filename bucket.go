package delayqueue

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// A bucket is one shard of the queue: a pool hash, a zset of job IDs scored
// by due time (and of reserved jobs, scored by lease deadline), and ready
// lists per topic, all under one hash tag. Every change to a bucket is one
// script over its keys.

// push adds jobs that all belong to bucket b in one script call, and sets
// each one's status.
func (q *DelayQueue) push(ctx context.Context, b int, jobs []*pushArgs) error {
	keys, args := q.pushCall(b, jobs)
	return pushResult(b, jobs, q.run(ctx, b, scriptPush, keys, args...))
}

// pushBuckets pushes jobs with one script call per bucket they fall in and
// chunk, all in one pipeline (one round trip per node), and sets each one's
// status. It returns the error of each bucket that failed; nil when all
// succeeded.
func (q *DelayQueue) pushBuckets(ctx context.Context, jobs []*pushArgs) map[int]error {
	chunks := byBucket(jobs, func(j *pushArgs) int { return j.bucket }, maxPushChunk)
	calls := make([]*scriptCall, len(chunks))
	for i, chunk := range chunks {
		keys, args := q.pushCall(chunk[0].bucket, chunk)
		calls[i] = &scriptCall{script: scriptPush, keys: keys, args: args}
	}
	q.sendCalls(ctx, calls)
	var errs map[int]error
	for i, chunk := range chunks {
		b := chunk[0].bucket
		if err := pushResult(b, chunk, calls[i].cmd); err != nil {
			if errs == nil {
				errs = map[int]error{}
			}
			errs[b] = cmp.Or(errs[b], err)
		}
	}
	return errs
}

// flushPushes pushes a batch of concurrent Push calls, coalesced.
func (q *DelayQueue) flushPushes(ctx context.Context, batch []*request[*pushArgs]) {
	jobs := make([]*pushArgs, len(batch))
	for i, r := range batch {
		jobs[i] = r.in
	}
	errs := q.pushBuckets(ctx, jobs)
	for _, r := range batch {
		r.err = errs[r.in.bucket]
	}
}

// pushCall builds the keys and arguments of push.lua for jobs of bucket b.
func (q *DelayQueue) pushCall(b int, jobs []*pushArgs) ([]string, []any) {
	bk := q.keys.bucket(b)
	args := make([]any, 0, 3+4*len(jobs))
	args = append(args, bk.wake, bk.readyChannels, q.pub)
	for _, j := range jobs {
		args = append(args, j.id, j.delayMs, j.job, j.generated)
	}
	return []string{bk.pool, bk.zset, bk.readyPrefix, bk.dedup}, args
}

// pushResult reads push.lua's reply into the jobs' statuses.
func pushResult(b int, jobs []*pushArgs, reply *redis.Cmd) error {
	res, err := reply.Int64Slice()
	if err != nil {
		return fmt.Errorf("delayqueue: push to bucket %d: %w", b, err)
	}
	if len(res) != len(jobs) {
		return fmt.Errorf("delayqueue: push to bucket %d: %d replies for %d jobs", b, len(res), len(jobs))
	}
	for i, r := range res {
		jobs[i].status = r
	}
	return nil
}

// moveResult is what one move step did.
type moveResult struct {
	moved int
	// next is how long until the bucket's next job is due; -1 when the
	// bucket is empty.
	next time.Duration
	// held is how long another process still holds the lease; zero when
	// this call held it.
	held time.Duration
	// contended is true when another process holds the lease.
	contended bool
	// mark is the mark of the script's run, which its ready wake-ups carry.
	mark string
	// ready counts the jobs that became ready, per topic.
	ready []topicCount
}

type topicCount struct {
	topic string
	count int
}

// moveDue moves up to a batch of due jobs of bucket b to their ready lists
// (or dead letters), holding or taking the bucket's lease with token. call
// numbers the call, for the mark of its wake-ups; with trim, it also
// deletes the tombstones whose dedup window ended.
func (q *DelayQueue) moveDue(ctx context.Context, b int, token string, call uint64, trim bool) (moveResult, error) {
	bk := q.keys.bucket(b)
	keys := []string{bk.zset, bk.pool, bk.readyPrefix, bk.deadPrefix, bk.lock, bk.deadTopics, bk.dedup}
	reply, err := q.run(ctx, b, scriptMove, keys,
		token, q.opts.lease.Milliseconds(), q.opts.batch, bk.readyChannels, q.pub, call, trim).Slice()
	if err != nil {
		return moveResult{}, fmt.Errorf("delayqueue: move bucket %d: %w", b, err)
	}
	var res [2]int64
	ok := len(reply) >= 2
	for i := 0; ok && i < 2; i++ {
		res[i], ok = reply[i].(int64)
	}
	if ok && res[0] < 0 {
		return moveResult{contended: true, held: time.Duration(max(res[1], 0)) * time.Millisecond}, nil
	}
	r := moveResult{moved: int(res[0]), next: -1}
	if ok = ok && len(reply)%2 == 1; ok {
		r.mark, ok = reply[2].(string)
	}
	if !ok {
		return moveResult{}, fmt.Errorf("delayqueue: move bucket %d: unexpected reply %v", b, reply)
	}
	if res[1] >= 0 {
		r.next = time.Duration(res[1]) * time.Microsecond
	}
	for i := 3; i+1 < len(reply); i += 2 {
		topic, _ := reply[i].(string)
		count, _ := reply[i+1].(int64)
		r.ready = append(r.ready, topicCount{topic, int(count)})
	}
	return r, nil
}
