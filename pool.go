package delayqueue

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/dqueue/delayqueue/internal/batch"
)

// The pool is each bucket's hash of job ID -> encoded job. A job exists
// exactly while its ID is in the pool; its state is part of the encoding.

// Get returns the job with the given ID as it is now, with its State and
// Attempts. RunAt is the due time of a delayed or ready job (a dead job's:
// when it died, as DiedAt); a reserved job has ReservedUntil instead and no
// RunAt, since its stored record keeps the reservation's end in place of
// the due time: the Pop or Consume that reserved it has it (and a
// schedule's job names its tick in its ID). It returns ErrNotFound when no
// such job exists (it was finished, removed, or never pushed) and
// ErrInvalidID for an ID no job can have.
func (q *DelayQueue) Get(ctx context.Context, id string) (*Job, error) {
	b, err := q.openBucketOfID(id)
	if err != nil {
		return nil, err
	}
	// A delayed job's due time is its score in the bucket (lib/codec.lua): a
	// read-only script reads both at once, and runs at maxmemory.
	bk := q.keys.bucket(b)
	reply, err := q.run(ctx, b, scriptGet, []string{bk.pool, bk.zset}, id).Slice()
	if err != nil {
		return nil, fmt.Errorf("delayqueue: get %q: %w", id, err)
	}
	if len(reply) == 0 {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	v, ok := reply[0].(string)
	score, _ := reply[1].(string)
	if !ok || len(reply) != 2 {
		return nil, fmt.Errorf("delayqueue: get %q: unexpected reply %v", id, reply)
	}
	job, err := decodeJob(id, []byte(v))
	if err != nil {
		return nil, err
	}
	// The reservation is the popper's: a job from Get cannot Retry, Touch
	// or Release it.
	job.reservation = 0
	if due, err := strconv.ParseFloat(score, 64); err == nil && job.State == StateDelayed {
		job.RunAt = time.UnixMilli(int64(due))
	}
	return job, nil
}

// Finish marks a reserved job done and deletes it. When this DelayQueue
// popped the job, Finish checks that the reservation it popped still holds:
// once that ran out and the job went back to ready or to another consumer,
// Finish changes nothing and returns ErrReservationLost, so a stale consumer
// cannot delete a job that another one now works on. A job this
// DelayQueue did not pop (popped by another process, or by this one more
// than an hour after that reservation ran out) is finished in whatever
// reservation it is now, as any process may. If the job was popped again
// by this DelayQueue, the latest reservation is the one checked. Finish
// returns ErrNotFound when no such job exists and ErrNotReserved when the
// job is not reserved. A Finish whose reply was lost and that the client
// re-sent returns ErrNotFound although the job was finished: treat
// ErrNotFound from Finish as "already gone".
func (q *DelayQueue) Finish(ctx context.Context, id string) error {
	if q.closed.Load() {
		return ErrClosed
	}
	var reservation any = ""
	held := q.held.get(id)
	if held.reservation != 0 {
		reservation = held.reservation
	}
	err := q.finish(ctx, id, reservation, held.topic)
	q.settledGrant(ctx, held.topic, held.grant, err)
	if err != nil {
		return err
	}
	q.held.settled(id, held.reservation)
	return nil
}

// finishCall is one job to finish.
type finishCall struct {
	b           int
	id          string
	reservation any // "" for any reservation
	status      int64
}

// finish deletes a reserved job; with a reservation, only while that reservation
// holds, so that a consumer whose reservation ran out leaves the job to the
// consumer that has it now. It works on a closed queue, so that Consume can
// settle the jobs its handlers finish after Close. Concurrent calls share
// script calls: one per bucket. topic, when known, is reported to the
// Observer.
func (q *DelayQueue) finish(ctx context.Context, id string, reservation any, topic string) error {
	b, err := bucketOfID(id, q.opts.buckets)
	if err != nil {
		return err
	}
	c := &finishCall{b: b, id: id, reservation: reservation}
	if err := q.finishes.For(b).Do(ctx, c); err != nil {
		return fmt.Errorf("delayqueue: finish %q: %w", id, err)
	}
	return q.finished(ctx, id, topic, c.status)
}

// finished reads finish.lua's status for job id of topic.
func (q *DelayQueue) finished(ctx context.Context, id, topic string, status int64) error {
	switch status {
	case finishNoJob:
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	case finishNotReserved:
		return fmt.Errorf("%w: %q", ErrNotReserved, id)
	case finishLost:
		return fmt.Errorf("%w: %q", ErrReservationLost, id)
	}
	q.observe(ctx, Event{Kind: EventFinished, Topic: topic, JobID: id})
	return nil
}

// finishKeys are finish.lua's keys in the bucket.
func (bk bucketKeys) finishKeys() []string {
	return []string{bk.pool, bk.zset, bk.dedup, bk.counts}
}

// finishLanes coalesce concurrent finishes, one batch in flight, as
// reserves do.
func (q *DelayQueue) finishLanes(n int) batch.Lanes[*finishCall] {
	return batch.NewLanes(n, maxPipelinedCalls, 1, q.flushFinishes)
}

// flushFinishes finishes a batch of coalesced finish calls: one script call
// per bucket, all in one pipeline.
func (q *DelayQueue) flushFinishes(ctx context.Context, reqs []*batch.Request[*finishCall]) {
	groups := batch.GroupBy(reqs,
		func(c *finishCall) int { return c.b },
		func(*finishCall) int { return 1 }, maxPipelinedCalls)
	calls := make([]*scriptCall, len(groups))
	for i, g := range groups {
		bk := q.keys.bucket(g.Key)
		args := make([]any, 0, 2*len(g.Reqs))
		for _, r := range g.Reqs {
			args = append(args, r.In.id, r.In.reservation)
		}
		calls[i] = &scriptCall{script: scriptFinish, keys: bk.finishKeys(), args: args, settles: true, bucket: g.Key}
	}
	q.sendCalls(ctx, calls)
	for i, g := range groups {
		res, err := calls[i].cmd.Int64Slice()
		if err == nil && len(res) != len(g.Reqs) {
			err = fmt.Errorf("%d replies for %d jobs", len(res), len(g.Reqs))
		}
		for j, r := range g.Reqs {
			if err != nil {
				r.Err = err
			} else {
				r.In.status = res[j]
			}
		}
	}
}

// Remove cancels a job in any state: it will not be delivered (again). It
// costs O(log n). It returns ErrNotFound when no such job exists.
//
// A reserved job is removed too, but its consumer is not stopped: a handler
// under Consume sees its ctx end, with context.Cause ErrNotFound, at the
// next extension of its reservation (within a third of the TTR), and a Pop
// user's Finish, Retry or Touch returns ErrNotFound. Work that must not run
// after a cancellation (pay versus cancel) needs its own check in the
// user's store; see the README's Patterns.
func (q *DelayQueue) Remove(ctx context.Context, id string) error {
	b, err := q.openBucketOfID(id)
	if err != nil {
		return err
	}
	bk := q.keys.bucket(b)
	r, err := q.run(ctx, b, scriptRemove, []string{bk.pool, bk.zset, bk.deadPrefix, bk.dedup, bk.deadTopics, bk.counts}, id).Int64()
	if err != nil {
		return fmt.Errorf("delayqueue: remove %q: %w", id, err)
	}
	if r == removeNoJob {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	q.held.settled(id, 0)
	return nil
}

// openBucketOfID checks that the queue is open and the ID valid, and
// returns the ID's bucket.
func (q *DelayQueue) openBucketOfID(id string) (int, error) {
	if q.closed.Load() {
		return 0, ErrClosed
	}
	return bucketOfID(id, q.opts.buckets)
}

// queueFormat is what a queue's meta hash records as its "format", and
// New checks: 4 is jobs in job format 2, with headers (bit 6), counts per
// bucket (keys.go), and a ready job's place in its ready list where a
// reserved one keeps its reservation (lib/places.lua). A queue written in another
// format is refused (ErrFormatMismatch).
const queueFormat = 4

// The job encoding. A job is stored in the pool as a 22-byte header, then
// the optional fields its flags announce, then topic, last error, headers
// and body. Numbers are unsigned big-endian.
//
//	offset  size  field
//	 0      1     flags: bit 7 set (the format marker; bit 7 clear is an
//	              encoding this version does not know); bit 6 set when
//	              headers follow, bit 5 a push nonce, bit 4 a dedup window,
//	              bit 3 a last error; the State in the low 3 bits
//	 1      2     attempts (deliveries so far)
//	 3      2     max attempts
//	 5      4     ttr_ms
//	 9      6     at_ms: a reserved job's reservation deadline (its score
//	              in its bucket), a ready job's due time, when a dead job
//	              died; not read for a delayed job, whose due time is its
//	              score
//	15      6     reservation: the number of a reserved job's reservation,
//	              by which a consumer proves it still holds the job; a
//	              ready job's place in its ready list (lib/places.lua)
//	21      1     topic length
//	22      [2]   last error length, when bit 3 is set
//	        [4]   dedup window ms, when bit 4 is set
//	        [4]   push nonce, when bit 5 is set: random, it marks a job of a
//	              generated ID, so that a push re-sent by go-redis knows its
//	              own earlier run from another job
//	        [2]   headers length, when bit 6 is set
//	        ...   topic, last error, headers, body (the rest: any bytes)
//
// The headers are opaque to the scripts, which carry them over unread:
// each key and then its value, as a uvarint length and the bytes, keys in
// order (encodeHeaders). A job without headers has neither bit 6 nor a
// byte for them, so it is encoded as before headers existed. A job of a
// 5-byte topic and a 128-byte body, with its push nonce, fits one 160-byte
// allocation of Redis's allocator. In Go, encodeJob writes the header and
// decodeJob reads it; in Lua, scripts/lib/header.lua writes it.
const (
	jobFormat     = 1 << 7 // the marker bit of an encoded job's first byte
	jobHasHeaders = 1 << 6
	jobHasNonce   = 1 << 5
	jobHasWindow  = 1 << 4
	jobHasError   = 1 << 3
	jobHeaderLen  = 22

	maxTTR         = (1<<32 - 1) * time.Millisecond // ttr_ms is 4 bytes
	maxMaxAttempts = 1<<16 - 1                      // max attempts is 2 bytes
	maxDedupWindow = (1<<32 - 1) * time.Millisecond // the window is 4 bytes
)

// encodeJob writes a new delayed job as push.lua stores it: no attempts, no
// reservation, no error, due at atMs (push.lua writes the due time of a delay),
// with a dedup window of windowMs, a push nonce (0: none of either) and
// headers as encodeHeaders wrote them (nil: none).
func encodeJob(topic string, body []byte, ttrMs int64, maxAttempts int, atMs, windowMs int64, nonce uint32, headers []byte) []byte {
	n := jobHeaderLen
	if windowMs > 0 {
		n += 4
	}
	if nonce != 0 {
		n += 4
	}
	if len(headers) > 0 {
		n += 2
	}
	v := make([]byte, jobHeaderLen, n+len(topic)+len(headers)+len(body))
	v[0] = jobFormat | byte(StateDelayed)
	binary.BigEndian.PutUint16(v[3:], uint16(maxAttempts))
	binary.BigEndian.PutUint32(v[5:], uint32(ttrMs))
	putUint48(v[9:], uint64(atMs))
	v[21] = byte(len(topic))
	if windowMs > 0 {
		v[0] |= jobHasWindow
		v = binary.BigEndian.AppendUint32(v, uint32(windowMs))
	}
	if nonce != 0 {
		v[0] |= jobHasNonce
		v = binary.BigEndian.AppendUint32(v, nonce)
	}
	if len(headers) > 0 {
		v[0] |= jobHasHeaders
		v = binary.BigEndian.AppendUint16(v, uint16(len(headers)))
	}
	v = append(v, topic...)
	v = append(v, headers...)
	return append(v, body...)
}

// encodeHeaders writes headers as a job's encoding carries them: each key
// and then its value, as a uvarint length and the bytes, keys in order so
// that equal headers encode alike; nil for none. Headers that
// validateHeaders accepts take at most 61,824 bytes, within the 2-byte
// length that announces them.
func encodeHeaders(h map[string]string) []byte {
	if len(h) == 0 {
		return nil
	}
	keys := make([]string, 0, len(h))
	size := 0
	for k, v := range h {
		keys = append(keys, k)
		size += len(k) + len(v) + 2*binary.MaxVarintLen32
	}
	slices.Sort(keys)
	b := make([]byte, 0, size)
	for _, k := range keys {
		b = appendString(appendString(b, k), h[k])
	}
	return b
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// decodeHeaders reads what encodeHeaders wrote.
func decodeHeaders(b []byte) (map[string]string, error) {
	h := map[string]string{}
	for len(b) > 0 {
		var kv [2]string
		for i := range kv {
			n, size := binary.Uvarint(b)
			if size <= 0 || uint64(len(b)-size) < n {
				return nil, errors.New("short headers")
			}
			kv[i], b = string(b[size:size+int(n)]), b[size+int(n):]
		}
		h[kv[0]] = kv[1]
	}
	return h, nil
}

func putUint48(b []byte, n uint64) {
	binary.BigEndian.PutUint16(b, uint16(n>>32))
	binary.BigEndian.PutUint32(b[2:], uint32(n))
}

func uint48(b []byte) int64 {
	return int64(binary.BigEndian.Uint16(b))<<32 | int64(binary.BigEndian.Uint32(b[2:]))
}

// decodeJob reads an encoded job.
func decodeJob(id string, v []byte) (*Job, error) {
	corrupt := func(why string) (*Job, error) {
		return nil, fmt.Errorf("delayqueue: job %q: corrupt encoding: %s", id, why)
	}
	if len(v) < jobHeaderLen {
		return corrupt("short header")
	}
	if v[0]&jobFormat == 0 {
		return nil, fmt.Errorf("delayqueue: job %q: unknown encoding: first byte %#x", id, v[0])
	}
	state := State(v[0] & 7)
	if state < StateDelayed || state > StateDead {
		return corrupt(fmt.Sprintf("state %d", state))
	}
	rest := v[jobHeaderLen:]
	errLen := 0
	if v[0]&jobHasError != 0 {
		if len(rest) < 2 {
			return corrupt("short error length")
		}
		errLen, rest = int(binary.BigEndian.Uint16(rest)), rest[2:]
	}
	var window time.Duration
	if v[0]&jobHasWindow != 0 {
		if len(rest) < 4 {
			return corrupt("short dedup window")
		}
		window, rest = time.Duration(binary.BigEndian.Uint32(rest))*time.Millisecond, rest[4:]
	}
	var nonce uint32
	if v[0]&jobHasNonce != 0 {
		if len(rest) < 4 {
			return corrupt("short push nonce")
		}
		nonce, rest = binary.BigEndian.Uint32(rest), rest[4:]
	}
	headersLen := 0
	if v[0]&jobHasHeaders != 0 {
		if len(rest) < 2 {
			return corrupt("short headers length")
		}
		headersLen, rest = int(binary.BigEndian.Uint16(rest)), rest[2:]
	}
	topicLen := int(v[21])
	if len(rest) < topicLen+errLen+headersLen {
		return corrupt("short topic, error or headers")
	}
	var headers map[string]string
	if headersLen > 0 {
		var err error
		if headers, err = decodeHeaders(rest[topicLen+errLen : topicLen+errLen+headersLen]); err != nil {
			return corrupt(err.Error())
		}
	}
	job := &Job{
		ID:          id,
		Topic:       string(rest[:topicLen]),
		LastError:   string(rest[topicLen : topicLen+errLen]),
		Headers:     headers,
		Body:        rest[topicLen+errLen+headersLen:],
		State:       state,
		Attempts:    int(binary.BigEndian.Uint16(v[1:])),
		MaxAttempts: int(binary.BigEndian.Uint16(v[3:])),
		TTR:         time.Duration(binary.BigEndian.Uint32(v[5:])) * time.Millisecond,
		DedupWindow: window,
		reservation: uint48(v[15:]),
		nonce:       nonce,
	}
	at := time.UnixMilli(uint48(v[9:]))
	switch job.State {
	case StateReserved:
		job.ReservedUntil = at
	case StateDead:
		job.DiedAt = at
		job.RunAt = at // as before DiedAt existed
	default:
		job.RunAt = at
	}
	return job, nil
}
