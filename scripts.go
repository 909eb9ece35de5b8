package delayqueue

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/dqueue/delayqueue/internal/batch"
	"github.com/redis/go-redis/v9"
)

// scriptCall is one script call over the keys of one bucket.
type scriptCall struct {
	script *luaScript
	keys   []string
	args   []any
	cmd    *redis.Cmd // the reply, once sent
	bucket int        // its bucket, where a caller needs it
	// record is the record slot of a reserve call (recordSlots), when
	// recorded is set.
	record   int
	recorded bool
	// finishes is how many jobs a reserve call finishes first: their
	// answers end its reply (reserveCall).
	finishes int
}

// run runs a script by SHA over keys of bucket b. Concurrent calls share
// round trips: while one is in flight, the calls that follow wait and then
// go together in one pipeline (see callLanes).
func (q *DelayQueue) run(ctx context.Context, b int, s *luaScript, keys []string, args ...any) *redis.Cmd {
	c := &scriptCall{script: s, keys: keys, args: args, bucket: b}
	if err := q.calls.For(b).Do(ctx, c); c.cmd == nil {
		// ctx ended while the call waited its turn: it was never sent.
		c.cmd = redis.NewCmd(ctx)
		c.cmd.SetErr(err)
	}
	return c.cmd
}

// callLanes coalesce the other script calls into pipelines, two in flight.
func (q *DelayQueue) callLanes(n int) batch.Lanes[*scriptCall] {
	return batch.NewLanes(n, maxPipelinedCalls, 2, q.flushCalls)
}

// flushCalls sends a batch of coalesced script calls.
func (q *DelayQueue) flushCalls(ctx context.Context, reqs []*batch.Request[*scriptCall]) {
	q.sendCalls(ctx, batch.Inputs(reqs))
	for _, r := range reqs {
		r.Err = r.In.cmd.Err()
	}
}

// sendCalls sends script calls, in one pipeline when there are several (one
// round trip per node), and sets each call's reply.
func (q *DelayQueue) sendCalls(ctx context.Context, calls []*scriptCall) {
	if q.readTimeout > 0 {
		// Still waiting as long as the client waits for a reply: some
		// attempt got none in time (go-redis sends it again, and says
		// nothing of it), so the link may have gone silent, and the
		// subscriptions with it, which would otherwise notice only at
		// their health check.
		slow := time.AfterFunc(q.readTimeout, q.probeSubscriptions)
		defer slow.Stop()
	}
	if len(calls) == 1 {
		c := calls[0]
		c.cmd = q.runScript(ctx, c.script, c.keys, c.args...)
	} else {
		pipe := q.client.Pipeline()
		functions := q.usesFunctions()
		for _, c := range calls {
			if functions {
				c.cmd = pipe.FCall(ctx, c.script.fn(), c.keys, c.args...)
			} else {
				c.cmd = c.script.on(q.plain).EvalSha(ctx, pipe, c.keys, c.args...)
			}
		}
		_, _ = pipe.Exec(ctx) // errors are read per call below
		for _, c := range calls {
			if notRun(c.cmd.Err()) {
				// The server has not seen the script or its function yet
				// (or restarted): runScript loads it, or runs it by SHA.
				c.cmd = q.runScript(ctx, c.script, c.keys, c.args...)
			}
		}
	}
	for _, c := range calls {
		q.noteError(ctx, c.cmd.Err())
		if err := redisError(c.cmd.Err()); err != c.cmd.Err() {
			c.cmd.SetErr(err)
		}
	}
}

// resendWindow bounds how long a reserve call whose reply was lost is sent
// again: a connection cut, or a short partition, is over well within it.
const resendWindow = 10 * time.Second

// resendUnanswered sends again, with backoff, the calls whose outcome is
// unknown (the connection broke, or timed out, after go-redis's own
// retries), until each is answered, ctx ends, or within has passed. Only
// for scripts whose second run answers as the first did: reserve.lua,
// from its record.
func (q *DelayQueue) resendUnanswered(ctx context.Context, calls []*scriptCall, within time.Duration) {
	deadline := time.Now().Add(within)
	var timer *time.Timer
	for n := 1; ; n++ {
		var lost []*scriptCall
		for _, c := range calls {
			if unanswered(c.cmd.Err()) {
				lost = append(lost, c)
			}
		}
		wait := retryBackoff(n)
		if len(lost) == 0 || time.Now().Add(wait).After(deadline) {
			return
		}
		if timer == nil {
			timer = time.NewTimer(wait)
			defer timer.Stop()
		} else {
			timer.Reset(wait)
		}
		select {
		case <-timer.C:
		case <-ctx.Done():
			return
		}
		q.sendCalls(ctx, lost)
	}
}

// unanswered reports whether err leaves a call's outcome unknown: no reply
// came, and the script may have run.
func unanswered(err error) bool {
	var reply redis.Error
	switch {
	case err == nil, errors.As(err, &reply), errors.Is(err, redis.ErrClosed),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false
	}
	return true
}

// probeSubscriptions has the subscriptions checked now (notifier.probe).
func (q *DelayQueue) probeSubscriptions() {
	q.mu.Lock()
	notes := q.notes
	q.mu.Unlock()
	if notes != nil {
		notes.probe()
	}
}

// byBucket splits items into the chunks that go in one script call each:
// those of one bucket, at most limit of them, in order.
func byBucket[T any](items []T, bucket func(T) int, limit int) [][]T {
	return byBucketSized(items, bucket, limit, nil, 0)
}

// byBucketSized is byBucket, with each chunk also at most maxSize in all by
// size (unless one item alone is more).
func byBucketSized[T any](items []T, bucket func(T) int, limit int, size func(T) int, maxSize int) [][]T {
	groups := map[int][]T{}
	var order []int
	for _, it := range items {
		b := bucket(it)
		if _, ok := groups[b]; !ok {
			order = append(order, b)
		}
		groups[b] = append(groups[b], it)
	}
	var chunks [][]T
	for _, b := range order {
		g := groups[b]
		for len(g) > 0 {
			n, total := 0, 0
			for n < len(g) && n < limit {
				if size != nil {
					total += size(g[n])
					if n > 0 && total > maxSize {
						break
					}
				}
				n++
			}
			chunks = append(chunks, g[:n:n])
			g = g[n:]
		}
	}
	return chunks
}

// recordSlots hands out the record keys of reserve calls (reserve.lua's
// KEYS[5], per bucket): a slot is handed out again once the call that had
// it was answered, and that call's record is then written over by the next
// one (no command spent deleting it). So a process keeps no more records
// than it has reserve calls under way, each until it expires or is written
// over. The slot of a call left unanswered (it may still run, late) is
// never handed out again.
type recordSlots struct {
	mu   sync.Mutex
	free []int
	next int
}

// take hands out a free slot.
func (s *recordSlots) take() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.free); n > 0 {
		k := s.free[n-1]
		s.free = s.free[:n-1]
		return k
	}
	s.next++
	return s.next - 1
}

// handBack makes slot k free again.
func (s *recordSlots) handBack(k int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free = append(s.free, k)
}

// idle returns the free slots: those whose calls were answered.
func (s *recordSlots) idle() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.free)
}

// recordKey is the key of record slot k in bucket bk.
func (q *DelayQueue) recordKey(bk bucketKeys, k int) string {
	return bk.record(q.callPrefix + strconv.Itoa(k))
}

// dropRecords deletes, at Close, the records of this instance's answered
// reserve calls in every bucket, which would otherwise stay until they
// expire. The record of a call still under way, or left without a reply,
// stays: the call may yet be sent again, and answer from it.
func (q *DelayQueue) dropRecords(ctx context.Context) error {
	free := q.records.idle()
	if len(free) == 0 {
		return nil
	}
	pipe := q.client.Pipeline()
	for b := range q.opts.buckets {
		bk := q.keys.bucket(b)
		keys := make([]string, len(free))
		for i, k := range free {
			keys[i] = q.recordKey(bk, k)
		}
		pipe.Del(ctx, keys...)
	}
	_, err := pipe.Exec(ctx)
	return redisError(err)
}

// answered hands the slots of the reserve calls among calls that were
// answered back. A call with no reply (its context ended while it was
// sent, or the connection broke) may still run: its slot is retired.
func (q *DelayQueue) answered(calls []*scriptCall) {
	for _, c := range calls {
		var reply redis.Error
		if err := c.cmd.Err(); c.recorded && (err == nil || errors.As(err, &reply)) {
			q.records.handBack(c.record)
			c.recorded = false
		}
	}
}

// callName returns a name no other reserve call of any process has: a
// random name of this instance (not its instance number, which a counter
// that went back can hand out twice) and a count.
func (q *DelayQueue) callName() string {
	n := q.reserveCalls.Add(1)
	return string(appendBase58([]byte(q.callPrefix), n))
}

// readTimeout is how long client waits for a reply; 0 or less for none,
// or when it cannot tell.
func readTimeout(client redis.UniversalClient) time.Duration {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ReadTimeout
	case *redis.ClusterClient:
		return c.Options().ReadTimeout
	}
	return 0
}

// recordLife is how long a reserve call's record lives when its caller
// never deletes it (the process died, or gave up on the reply): longer than
// go-redis can go on re-sending the call, as the client's options set it.
func recordLife(client redis.UniversalClient) time.Duration {
	var retries int
	var dial, read, write, backoff time.Duration
	switch c := client.(type) {
	case *redis.Client:
		o := c.Options()
		retries, dial, read, write, backoff = o.MaxRetries, o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.MaxRetryBackoff
	case *redis.ClusterClient:
		o := c.Options()
		retries, dial, read, write, backoff = o.MaxRetries, o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.MaxRetryBackoff
	default:
		return time.Minute
	}
	if read <= 0 || write <= 0 {
		// No timeout: a lost reply shows as a broken connection.
		read, write = max(read, 10*time.Second), max(write, 10*time.Second)
	}
	life := time.Duration(max(retries, 0)+1) * (dial + write + read + backoff)
	return max(life, 30*time.Second)
}

// noteError asks a Cluster client to reload its slot map after a connection
// error or CLUSTERDOWN. Left alone, go-redis keeps sending a dead master's
// slots to it until its periodic reload (every 60s by default), long after
// a replica took over.
func (q *DelayQueue) noteError(ctx context.Context, err error) {
	cc, ok := q.client.(*redis.ClusterClient)
	if !ok || err == nil || errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) {
		return
	}
	var reply redis.Error
	if !errors.As(err, &reply) || redis.IsClusterDownError(err) {
		cc.ReloadState(ctx) // in the background, at most every 200ms
		q.mu.Lock()
		blocking, own := q.blocking.(*redis.ClusterClient)
		q.mu.Unlock()
		if own {
			blocking.ReloadState(ctx) // the blocked calls' client learns it too
		}
	}
}

// maxPipelinedCalls bounds how many script calls go in one pipeline.
const maxPipelinedCalls = 256
