package delayqueue

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
)

// IDs that no other process makes. Each DelayQueue takes an instance number
// of its own from the queue's counter in Redis (init.lua, HINCRBY on the
// meta hash: never handed out twice while Redis keeps that hash) and counts
// its IDs from zero. An ID is "~" (which no caller's ID may begin with),
// then, in base 58, one digit saying how many digits the instance number
// has, the instance number, and the count. No ID's digits are a prefix of
// another instance's, so two (instance, count) pairs never spell one ID,
// however many processes open the queue over its life; an ID is 4
// characters to start with and grows by one for every 58-fold of instances
// or of counts (nextIn, below, leaves some counts unused).
//
// Should the counter ever go back (Redis lost the meta hash, or a failover
// lost its last writes) while an older process still uses its number, a
// push may find its ID held by another job: push.lua tells that from its
// own earlier run by the job's push nonce, and says so; Push then takes a
// new instance number and pushes again under a new ID. It cannot see an ID
// whose job is already gone: that ID is made again, for a new job.

const base58Digits = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"

// idGen makes the IDs of one DelayQueue. It is safe for concurrent use.
type idGen struct {
	prefix atomic.Pointer[string] // the length digit and the instance number
	count  atomic.Uint64
	made   atomic.Uint64 // IDs made by nextIn, for its runs
}

// instancePrefix is the start of the IDs of instance number n (n >= 1).
func instancePrefix(n int64) *string {
	digits := appendBase58(nil, uint64(n))
	p := generatedMark + string(base58Digits[len(digits)]) + string(digits)
	return &p
}

// next returns a new ID.
func (g *idGen) next() string {
	prefix := g.prefix.Load()
	n := g.count.Add(1) - 1
	return string(appendBase58([]byte(*prefix), n))
}

// Generated IDs fill one bucket at a time. A job's bucket is its ID's hash
// (bucketOf), so the generator picks, among its next IDs, one whose hash
// falls in the bucket of the moment, and leaves the counts it skips unused.
// Jobs pushed together then share a bucket: concurrent pushes go in one
// script call rather than one per bucket, and jobs due together are moved
// and reserved together, in one call, where spread over every bucket each
// took a call of its own. Over time the IDs still spread evenly: the bucket
// moves on after idRun IDs or idRunTime, whichever comes first, and each
// instance starts at a bucket of its own (its instance number), so that
// concurrent producers fill different buckets.
const (
	idRun     = 100
	idRunTime = 10 * time.Millisecond
	// maxTargetBuckets bounds the buckets among which IDs are picked: the
	// generator hashes about as many IDs as there are buckets for each
	// it keeps (about 45 ns each: 0.6 µs an ID with 8 buckets, 3 µs with
	// 64). Beyond it, IDs spread by their hash alone.
	maxTargetBuckets = 64
)

// nextIn returns a new ID whose bucket, among buckets, is the one of
// epoch (a count that moves on every idRunTime; see idEpoch) and of the
// IDs made so far.
func (g *idGen) nextIn(buckets int, epoch int64) string {
	if buckets <= 1 || buckets > maxTargetBuckets {
		return g.next()
	}
	run := g.made.Add(1) / idRun
	target := int((uint64(epoch) + run) % uint64(buckets))
	prefix := g.prefix.Load()
	var buf [32]byte
	for {
		id := appendBase58(append(buf[:0], *prefix...), g.count.Add(1)-1)
		if bucketOfBytes(id, buckets) == target {
			return string(id)
		}
	}
}

// idEpoch is the count that moves generated IDs on to the next bucket
// every idRunTime, starting from the instance's own.
func (q *DelayQueue) idEpoch() int64 {
	return q.instance + time.Now().UnixMilli()/idRunTime.Milliseconds()
}

// appendBase58 appends n's base-58 digits, most significant first.
func appendBase58(b []byte, n uint64) []byte {
	var digits [11]byte // 58^11 > 2^64
	i := len(digits)
	for {
		i--
		digits[i] = base58Digits[n%58]
		n /= 58
		if n == 0 {
			break
		}
	}
	return append(b, digits[i:]...)
}

// maxIDRenewals bounds how often one push takes a new instance number
// because its generated ID was taken. A counter that went back by k may
// hand out up to k numbers still in use before a free one.
const maxIDRenewals = 16

// renewIDs takes a new instance number, unless another push already
// replaced the prefix of taken, the generated ID found taken. (No
// instance's prefix begins another's: the prefix that taken begins with is
// the one it was made with.)
func (q *DelayQueue) renewIDs(ctx context.Context, taken string) error {
	prefix := q.ids.prefix.Load()
	if !strings.HasPrefix(taken, *prefix) {
		return nil
	}
	n, err := q.client.HIncrBy(ctx, q.keys.meta(), "nodes", 1).Result()
	if err != nil {
		q.noteError(ctx, err)
		return fmt.Errorf("delayqueue: take a new instance number: %w", redisError(err))
	}
	q.opts.logger.Warn("delayqueue: a generated job ID was taken by another job; the queue's instance counter went back (lost Redis data?); using a new instance number",
		"taken_prefix", *prefix, "instance", n)
	q.ids.prefix.CompareAndSwap(prefix, instancePrefix(n)) // the first renewal wins
	return nil
}
