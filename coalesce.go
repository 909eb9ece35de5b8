package delayqueue

import (
	"context"
	"slices"
	"sync"
)

// A coalescer sends concurrent requests together (group commit): while its
// batches are in flight (at most inflight of them), later callers queue up,
// and when one returns, the first of them sends everything queued, up to
// max, as the next batch. A lone
// caller sends at once and pays nothing for it; under load, many callers
// share a round trip and a script call.
type coalescer[T any] struct {
	max      int // requests per batch
	inflight int // batches in flight at most; 0 means 1
	// flush sends a batch and sets every request's err.
	flush func(ctx context.Context, batch []*request[T])

	mu    sync.Mutex // guards the fields below
	busy  int        // batches in flight
	queue []*request[T]
}

// newLanes makes n lanes that each keep up to inflight batches in flight.
// With two, Redis works on one while the client reads the other's replies
// and gathers the next, which keeps a lone producer's pushes flowing; with
// one, more callers wait behind the batch in flight and go together, so
// a busy consumer's reserves and finishes cost Redis fewer calls.
func newLanes[T any](n, max, inflight int, flush func(context.Context, []*request[T])) []*coalescer[T] {
	lanes := make([]*coalescer[T], n)
	for i := range lanes {
		lanes[i] = &coalescer[T]{max: max, inflight: inflight, flush: flush}
	}
	return lanes
}

// lane picks bucket b's coalescer: the queue has one on a single server,
// and one per bucket on a Cluster, so that a stalled node holds up only the
// calls to its own buckets.
func lane[T any](lanes []*coalescer[T], b int) *coalescer[T] {
	return lanes[b%len(lanes)]
}

type request[T any] struct {
	in   T
	err  error
	done chan struct{}      // closed once err is set
	lead chan []*request[T] // hands this request the next batch to send
}

// do sends in, alone or with others, and returns its outcome. A caller whose
// ctx ends while it still waits in the queue returns ctx.Err(), and its
// request is never sent; once sent, it waits for the outcome.
func (c *coalescer[T]) do(ctx context.Context, in T) error {
	r := &request[T]{in: in}
	c.mu.Lock()
	if c.busy < max(c.inflight, 1) {
		c.busy++
		c.mu.Unlock()
		return c.send(ctx, []*request[T]{r})
	}
	r.done, r.lead = make(chan struct{}), make(chan []*request[T], 1)
	c.queue = append(c.queue, r)
	c.mu.Unlock()
	cancelled := ctx.Done()
	for {
		select {
		case batch := <-r.lead:
			return c.send(ctx, batch)
		case <-r.done:
			return r.err
		case <-cancelled:
			if c.dequeue(r) {
				return ctx.Err()
			}
			cancelled = nil // already sent: wait for the outcome
		}
	}
}

// dequeue takes r off the queue, and reports whether it was still there.
func (c *coalescer[T]) dequeue(r *request[T]) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.Index(c.queue, r)
	if i >= 0 {
		c.queue = slices.Delete(c.queue, i, i+1)
	}
	return i >= 0
}

// send flushes batch, whose first request is the caller's, passes the queue
// on to its first request, and returns the caller's outcome.
func (c *coalescer[T]) send(ctx context.Context, batch []*request[T]) error {
	if len(batch) > 1 {
		// Others' requests ride on this call: the caller's cancellation
		// must not cut them off (the client's timeouts still bound it).
		ctx = context.WithoutCancel(ctx)
	}
	c.flush(ctx, batch)
	c.mu.Lock()
	n := min(len(c.queue), c.max)
	next := c.queue[:n:n]
	c.queue = c.queue[n:]
	if len(c.queue) == 0 {
		c.queue = nil
	}
	if n == 0 {
		c.busy--
	}
	c.mu.Unlock()
	for _, r := range batch[1:] {
		close(r.done)
	}
	if n > 0 {
		next[0].lead <- next
	}
	return batch[0].err
}

// A callGroup is the requests of a batch that go in one script call.
type callGroup[T any, K comparable] struct {
	key  K
	size int
	reqs []*request[T]
}

// groupBatch splits a batch into groups by key, in order of first
// appearance, and starts another group for a key when the next request
// would take its group past limit in total size.
func groupBatch[T any, K comparable](batch []*request[T], key func(T) K, size func(T) int, limit int) []*callGroup[T, K] {
	var groups []*callGroup[T, K]
	open := map[K]*callGroup[T, K]{}
	for _, r := range batch {
		k, n := key(r.in), size(r.in)
		g := open[k]
		if g == nil || g.size+n > limit {
			g = &callGroup[T, K]{key: k}
			open[k] = g
			groups = append(groups, g)
		}
		g.size += n
		g.reqs = append(g.reqs, r)
	}
	return groups
}
