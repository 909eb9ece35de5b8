package dashboard

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/dqueue/delayqueue"
)

// The overview's figures are read from Redis at most once in a while, and
// by one call at a time: an Overview is kept and shown again for
// freshFor, or for freshPerCall times as long as it took when that is
// longer, so that a dashboard keeps Redis busy at most a twentieth of the
// time, however many browsers look at it. Requests that come while a
// call is under way wait for it. An action drops what is kept, so that
// the page it returns to shows what it did.

const (
	freshFor     = 2 * time.Second
	freshPerCall = 20
)

// figures are what the overview page shows: the queue's Overview, and its
// schedules and history when the queue has them (scheduleLister,
// historyReader).
type figures struct {
	delayqueue.Overview
	Schedules []delayqueue.Schedule
	History   []delayqueue.Sample
}

// snapshot is an Overview as the overview page reads it.
type snapshot struct {
	figures
	names  []string // the topics, sorted
	paused map[string]bool
	at     time.Time // when the call began
	took   time.Duration
}

// overviewCache keeps the last snapshot and shares the call that reads
// the next. It is safe for concurrent use.
type overviewCache struct {
	fetch func(context.Context) (figures, error)
	now   func() time.Time

	mu     sync.Mutex
	gen    int // counts the drops
	last   *snapshot
	lastOf int // the gen last was read in
	flight *flight
}

// flight is a call under way, and then its outcome.
type flight struct {
	gen     int
	waiting int // requests waiting for it, besides the one that made it
	done    chan struct{}
	snap    *snapshot
	err     error
}

func newOverviewCache(fetch func(context.Context) (figures, error)) *overviewCache {
	return &overviewCache{fetch: fetch, now: time.Now}
}

// get returns the kept snapshot while it is fresh; else it joins the call
// under way, or makes one. A call outlives the request that made it, so
// that the others waiting for it are not let down when that one goes.
func (c *overviewCache) get(ctx context.Context) (*snapshot, error) {
	c.mu.Lock()
	if s := c.last; s != nil && c.lastOf == c.gen && c.now().Sub(s.at) < max(freshFor, freshPerCall*s.took) {
		c.mu.Unlock()
		return s, nil
	}
	f := c.flight
	if f != nil && f.gen == c.gen {
		f.waiting++
		c.mu.Unlock()
		select {
		case <-f.done:
			return f.snap, f.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f = &flight{gen: c.gen, done: make(chan struct{}), err: errNoOverview}
	c.flight = f
	c.mu.Unlock()
	defer c.land(f) // even when fetch panics

	start := c.now()
	fig, err := c.fetch(context.WithoutCancel(ctx))
	f.err = err
	if err == nil {
		f.snap = newSnapshot(fig, start, c.now().Sub(start))
	}
	return f.snap, f.err
}

// errNoOverview is what those waiting for a call get when it panicked.
var errNoOverview = errors.New("dashboard: the overview's figures could not be read")

// land ends a call: its snapshot is kept unless a later one is, and those
// waiting for it are given its outcome.
func (c *overviewCache) land(f *flight) {
	c.mu.Lock()
	if c.flight == f {
		c.flight = nil
	}
	if f.snap != nil && f.gen >= c.lastOf {
		c.last, c.lastOf = f.snap, f.gen
	}
	c.mu.Unlock()
	close(f.done)
}

// drop makes the next get read anew, not joining a call already under way.
func (c *overviewCache) drop() {
	c.mu.Lock()
	c.gen++
	c.mu.Unlock()
}

func newSnapshot(fig figures, at time.Time, took time.Duration) *snapshot {
	ov := fig.Overview
	s := &snapshot{figures: fig, at: at, took: took, names: make([]string, 0, len(ov.Topics)), paused: map[string]bool{}}
	for name := range ov.Topics {
		s.names = append(s.names, name)
	}
	slices.Sort(s.names)
	for _, name := range ov.Paused {
		s.paused[name] = true
	}
	return s
}
