// Package batch sends concurrent requests together (group commit): while a
// lane's batches are in flight, later callers queue up, and when one
// returns, the first of them sends everything queued as the next batch. A
// lone caller sends at once and pays nothing for it (unless the lane
// waits, briefly, for callers announced, Expect, or the caller is in no
// hurry, DoWithin); under load, many callers share one round trip. The
// package knows nothing of what a request is: the flush function given to
// a lane sends a batch and sets each request's Err.
package batch

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// A Lane coalesces the requests of its callers into batches.
type Lane[T any] struct {
	max      int // requests per batch
	inflight int // batches in flight at most
	flush    func(ctx context.Context, batch []*Request[T])

	calm atomic.Int64 // requests in no hurry in the queue: Take looks without the lock

	mu      sync.Mutex // guards the fields below
	busy    int        // batches in flight
	queue   []*Request[T]
	expect  int         // callers announced (Expect) and not come yet
	wait    *time.Timer // ends the wait for them, or for company
	waiting bool        // wait is set to fire
	until   time.Time   // when it fires
	called  bool        // callers were announced during the wait
}

// NewLane makes a lane that sends batches of up to max requests, with up
// to inflight of them in flight (at least one). With two, the server works
// on one while the client reads the other's replies and gathers the next,
// which keeps a lone caller's requests flowing; with one, more callers wait
// behind the batch in flight and go together, so a busy client sends fewer,
// larger batches. flush sends a batch and sets every request's Err.
func NewLane[T any](max, inflight int, flush func(context.Context, []*Request[T])) *Lane[T] {
	return &Lane[T]{max: max, inflight: inflight, flush: flush}
}

// Lanes are independent lanes, so that a stalled destination holds up only
// the requests to its own lane.
type Lanes[T any] []*Lane[T]

// NewLanes makes n lanes, each as NewLane makes it.
func NewLanes[T any](n, max, inflight int, flush func(context.Context, []*Request[T])) Lanes[T] {
	lanes := make(Lanes[T], n)
	for i := range lanes {
		lanes[i] = NewLane(max, inflight, flush)
	}
	return lanes
}

// For picks the lane of destination k: k modulo the number of lanes.
func (l Lanes[T]) For(k int) *Lane[T] {
	return l[k%len(l)]
}

// A Request is one caller's input, and the outcome flush gave it.
type Request[T any] struct {
	In  T
	Err error

	done chan struct{}      // closed once Err is set
	lead chan []*Request[T] // hands this request the next batch to send
	by   time.Time          // DoWithin: when it goes, alone if it must; zero: at once
	// DoWithin: it goes once this many requests are queued (0: a full batch)
	enough int
}

// Do sends in, alone or with others, and returns its outcome. A caller whose
// ctx ends while it still waits in the queue returns ctx.Err(), and its
// request is never sent; once sent, it waits for the outcome.
func (c *Lane[T]) Do(ctx context.Context, in T) error {
	return c.do(ctx, &Request[T]{In: in})
}

// DoWithin is Do for a caller in no hurry: its request goes once enough
// requests are queued with it (0 or more than a batch holds: a full batch),
// or one of them is in a hurry (Do), or within has passed, whichever comes
// first; and while a batch is in flight it goes with the next, as any
// request does. A lone caller's request waits within.
func (c *Lane[T]) DoWithin(ctx context.Context, in T, within time.Duration, enough int) error {
	r := &Request[T]{In: in, enough: enough}
	if within > 0 {
		r.by = time.Now().Add(within)
	}
	return c.do(ctx, r)
}

func (c *Lane[T]) do(ctx context.Context, r *Request[T]) error {
	c.mu.Lock()
	if c.expect > 0 {
		c.expect--
	}
	c.queue = append(c.queue, r)
	if c.idleLocked() && c.expect == 0 && c.dueLocked() {
		// Those who came while the lane waited for them go along.
		c.queue = c.queue[:len(c.queue)-1]
		batch := append([]*Request[T]{r}, c.takeLocked(c.max-1)...)
		c.busy++
		c.mu.Unlock()
		return c.send(ctx, batch)
	}
	if !r.by.IsZero() {
		c.calm.Add(1)
	}
	r.done, r.lead = make(chan struct{}), make(chan []*Request[T], 1)
	c.mu.Unlock()
	cancelled := ctx.Done()
	for {
		select {
		case batch := <-r.lead:
			return c.send(ctx, batch)
		case <-r.done:
			return r.Err
		case <-cancelled:
			if c.dequeue(r) {
				return ctx.Err()
			}
			cancelled = nil // already sent: wait for the outcome
		}
	}
}

// Expect announces n callers about to come (woken together, say): until
// they have come, or within has passed since the first announcement of
// the wait, a lane with no batch in flight holds the requests that come
// (anyone's, each counted as one of them) and sends them as one batch.
// Otherwise the first is sent alone and the others wait for its outcome,
// to go in a second. Announcements during a wait join it: they do not
// make it longer.
func (c *Lane[T]) Expect(n int, within time.Duration) {
	if n < 2 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expect += n
	c.waitLocked(time.Now(), within)
	c.called = true
}

// waitLocked holds the requests that come until within from now, or
// until the lane's wait ends if that comes first: a wait is never made
// longer.
func (c *Lane[T]) waitLocked(now time.Time, within time.Duration) {
	until := now.Add(within)
	if c.waiting && !c.until.After(until) {
		return
	}
	c.waiting, c.until = true, until
	if c.wait == nil {
		c.wait = time.AfterFunc(within, c.waited)
	} else {
		c.wait.Reset(within)
	}
}

// waited ends the wait for the callers announced: those who came go, as
// a batch sent by the first of them.
func (c *Lane[T]) waited() {
	c.mu.Lock()
	called := c.called
	c.expect, c.waiting, c.called = 0, false, false
	var batch []*Request[T]
	// Only a wait leaves requests queued with no batch in flight. A wait
	// for company that ended early (its requests went with others, and
	// later ones came) waits on until the first of those is due.
	if c.idleLocked() && len(c.queue) > 0 && (called || c.dueLocked()) {
		batch = c.takeLocked(c.max)
		c.busy++
	}
	c.mu.Unlock()
	if batch != nil {
		batch[0].lead <- batch
	}
}

// dueLocked reports whether the queue goes now, once the lane may send:
// it does unless every request in it is in no hurry (DoWithin), none is
// due yet and they are not enough. If it does not, the lane waits until
// the first of them is due.
func (c *Lane[T]) dueLocked() bool {
	if len(c.queue) == 0 || len(c.queue) >= c.max {
		return true
	}
	first := c.queue[0].by
	for _, r := range c.queue {
		if r.by.IsZero() || (r.enough > 0 && len(c.queue) >= r.enough) {
			return true
		}
		if r.by.Before(first) {
			first = r.by
		}
	}
	now := time.Now()
	if !now.Before(first) {
		return true
	}
	c.waitLocked(now, first.Sub(now))
	return false
}

// Take takes up to n of the queued requests in no hurry (DoWithin) whose
// inputs keep reports true off the queue, for the caller to send with a
// call of its own (one that goes anyway, which they ride on). The caller
// sets each one's Err, or its outcome in In, and ends it with Done.
// Requests in a hurry are left to go with the lane's next batch: taking
// them would split it, not spare a call.
func (c *Lane[T]) Take(n int, keep func(T) bool) []*Request[T] {
	if c.calm.Load() == 0 {
		return nil // spares the lock the lane's callers contend for
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var taken []*Request[T]
	rest := c.queue[:0]
	for _, r := range c.queue {
		if len(taken) < n && !r.by.IsZero() && keep(r.In) {
			c.calm.Add(-1)
			taken = append(taken, r)
		} else {
			rest = append(rest, r)
		}
	}
	clear(c.queue[len(rest):])
	c.queue = rest
	if len(c.queue) == 0 {
		c.queue = nil
	}
	return taken
}

// Done ends a request taken with Take: its caller returns its Err.
func (r *Request[T]) Done() {
	close(r.done)
}

// Queued returns how many requests wait to be sent.
func (c *Lane[T]) Queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// idleLocked reports whether the lane may send another batch now.
func (c *Lane[T]) idleLocked() bool {
	return c.busy < max(c.inflight, 1)
}

// takeLocked takes up to n requests off the head of the queue.
func (c *Lane[T]) takeLocked(n int) []*Request[T] {
	n = min(len(c.queue), n)
	taken := c.queue[:n:n]
	for _, r := range taken {
		if !r.by.IsZero() {
			c.calm.Add(-1)
		}
	}
	c.queue = c.queue[n:]
	if len(c.queue) == 0 {
		c.queue = nil
	}
	return taken
}

// dequeue takes r off the queue, and reports whether it was still there.
func (c *Lane[T]) dequeue(r *Request[T]) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.Index(c.queue, r)
	if i >= 0 {
		c.queue = slices.Delete(c.queue, i, i+1)
		if !r.by.IsZero() {
			c.calm.Add(-1)
		}
	}
	return i >= 0
}

// send flushes batch, whose first request is the caller's, passes the queue
// on to its first request, and returns the caller's outcome.
func (c *Lane[T]) send(ctx context.Context, batch []*Request[T]) error {
	if len(batch) > 1 {
		// Others' requests ride on this call: the caller's cancellation
		// must not cut them off (the client's timeouts still bound it).
		ctx = context.WithoutCancel(ctx)
	}
	c.flush(ctx, batch)
	c.mu.Lock()
	var next []*Request[T]
	if c.dueLocked() {
		next = c.takeLocked(c.max)
	}
	n := len(next)
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
	return batch[0].Err
}

// Inputs returns the inputs of a batch's requests, in order.
func Inputs[T any](reqs []*Request[T]) []T {
	ins := make([]T, len(reqs))
	for i, r := range reqs {
		ins[i] = r.In
	}
	return ins
}

// A Group is the requests of a batch that go together in one call.
type Group[T any, K comparable] struct {
	Key  K
	Size int
	Reqs []*Request[T]
}

// GroupBy splits a batch into groups by key, in order of first appearance,
// and starts another group for a key when the next request would take its
// group past limit in total size.
func GroupBy[T any, K comparable](batch []*Request[T], key func(T) K, size func(T) int, limit int) []*Group[T, K] {
	var groups []*Group[T, K]
	open := map[K]*Group[T, K]{}
	for _, r := range batch {
		k, n := key(r.In), size(r.In)
		g := open[k]
		if g == nil || g.Size+n > limit {
			g = &Group[T, K]{Key: k}
			open[k] = g
			groups = append(groups, g)
		}
		g.Size += n
		g.Reqs = append(g.Reqs, r)
	}
	return groups
}
