package batch

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gate is a flush that records its batches and holds the first one until
// released, so that other callers queue up behind it.
type gate struct {
	mu      sync.Mutex
	batches [][]int
	held    chan struct{}
	release chan struct{}
}

func newGate() *gate {
	return &gate{held: make(chan struct{}), release: make(chan struct{})}
}

func (g *gate) flush(_ context.Context, batch []*Request[int]) {
	g.mu.Lock()
	var ins []int
	for _, r := range batch {
		ins = append(ins, r.In)
		if r.In < 0 {
			r.Err = errors.New("refused")
		}
	}
	g.batches = append(g.batches, ins)
	first := len(g.batches) == 1
	g.mu.Unlock()
	if first {
		close(g.held)
		<-g.release
	}
}

// openGate is a gate that holds no batch.
func openGate() *gate {
	g := newGate()
	close(g.release)
	return g
}

// queued waits until n requests wait behind the batch in flight.
func queued[T any](t *testing.T, c *Lane[T], n int) {
	t.Helper()
	require.Eventually(t, func() bool { return c.Queued() == n }, 10*time.Second, time.Millisecond)
}

// heldLane makes a lane of up to 100 requests, one batch in flight, and
// sends a first request (0) that the gate holds in flight; errs takes
// every caller's outcome, up to n.
func heldLane(n int) (*gate, *Lane[int], chan error) {
	g := newGate()
	c := NewLane(100, 1, g.flush)
	errs := make(chan error, n)
	go func() { errs <- c.Do(context.Background(), 0) }()
	<-g.held
	return g, c, errs
}

func TestLaneSendsQueuedCallsAsOneBatch(t *testing.T) {
	g, c, errs := heldLane(6)
	ctx := context.Background()
	for _, in := range []int{1, 2, -3, 4, 5} {
		go func() { errs <- c.Do(ctx, in) }()
	}
	queued(t, c, 5)
	close(g.release)
	failed := 0
	for range 6 {
		if err := <-errs; err != nil {
			failed++
		}
	}
	assert.Equal(t, 1, failed, "only the refused request fails")
	require.Len(t, g.batches, 2)
	assert.Equal(t, []int{0}, g.batches[0])
	assert.ElementsMatch(t, []int{1, 2, -3, 4, 5}, g.batches[1], "the queue went out in one batch")
	assert.Zero(t, c.busy)
}

// Callers announced as woken together go in one batch, the first one
// included, where it would otherwise go alone.
func TestLaneSendsTheCallersAnnouncedInOneBatch(t *testing.T) {
	g := openGate()
	c := NewLane(100, 1, g.flush)
	c.Expect(3, time.Hour)
	ctx := context.Background()
	errs := make(chan error, 3)
	for in := range 3 {
		go func() { errs <- c.Do(ctx, in) }()
	}
	for range 3 {
		require.NoError(t, <-errs)
	}
	require.Len(t, g.batches, 1)
	assert.ElementsMatch(t, []int{0, 1, 2}, g.batches[0])
	assert.Zero(t, c.busy)
}

// Callers announced who do not come hold up those who came only until the
// wait ends (here ended by hand); then the lane sends as before, and a
// second announcement during a wait does not make it longer.
func TestLaneWaitsForTheCallersAnnouncedOnlySoLong(t *testing.T) {
	g := openGate()
	c := NewLane(100, 1, g.flush)
	c.Expect(3, time.Hour)
	ctx := context.Background()
	errs := make(chan error, 1)
	go func() { errs <- c.Do(ctx, 7) }()
	queued(t, c, 1)
	assert.Empty(t, g.batches, "held for the others")
	c.Expect(2, time.Hour)
	assert.True(t, c.waiting)
	assert.Equal(t, 4, c.expect, "joined the wait")
	c.waited()
	require.NoError(t, <-errs, "sent once the wait ended")
	require.NoError(t, c.Do(ctx, 8))
	assert.Equal(t, [][]int{{7}, {8}}, g.batches)
	assert.Zero(t, c.busy)
	assert.Zero(t, c.expect)
	c.wait.Stop()
}

// Requests in no hurry wait for company while the lane is idle, and go at
// once with a request in a hurry; queued behind a batch in flight, they
// go with the next as every request does, unless every one of them is in
// no hurry and none is due: then the lane waits for the first to be due
// (here ended by hand).
func TestLaneHoldsRequestsInNoHurryForCompany(t *testing.T) {
	g := openGate()
	c := NewLane(100, 1, g.flush)
	ctx := context.Background()
	errs := make(chan error, 3)
	for in := range 2 {
		go func() { errs <- c.DoWithin(ctx, in, time.Hour, 0) }()
	}
	queued(t, c, 2)
	assert.Empty(t, g.batches, "held for company")
	assert.True(t, c.waiting)
	require.NoError(t, c.Do(ctx, 2))
	for range 2 {
		require.NoError(t, recv(t, errs))
	}
	require.Len(t, g.batches, 1)
	assert.ElementsMatch(t, []int{0, 1, 2}, g.batches[0], "a request in a hurry takes them along")

	// The wait armed for the first two ends: a request that came since,
	// due later, waits on.
	go func() { errs <- c.DoWithin(ctx, 3, 2*time.Hour, 0) }()
	queued(t, c, 1)
	c.waited()
	assert.Equal(t, 1, c.Queued(), "not due yet")
	assert.True(t, c.waiting, "waits until it is")
	require.NoError(t, c.Do(ctx, 4))
	require.NoError(t, recv(t, errs))
	require.Len(t, g.batches, 2)
	assert.ElementsMatch(t, []int{3, 4}, g.batches[1])
	assert.Zero(t, c.busy)
	assert.Zero(t, c.calm.Load(), "none in no hurry is left")
	c.wait.Stop()
}

// Requests in no hurry taken off the queue ride on the taker's call: the
// taker sets their outcomes, and the lane never sends them. The others,
// and requests in a hurry, stay queued for the lane's next batch.
func TestLaneHandsQueuedRequestsToATaker(t *testing.T) {
	g, c, errs := heldLane(6)
	ctx := context.Background()
	for in := 1; in <= 4; in++ {
		go func() { errs <- c.DoWithin(ctx, in, time.Hour, 0) }()
	}
	go func() { errs <- c.Do(ctx, 5) }()
	queued(t, c, 5)
	odd := func(in int) bool { return in%2 == 1 }
	taken := c.Take(1, odd)
	require.Len(t, taken, 1, "no more than asked")
	taken = append(taken, c.Take(10, odd)...)
	assert.ElementsMatch(t, []int{1, 3}, Inputs(taken), "not 5, in a hurry")
	taken[0].Err = errors.New("refused")
	for _, r := range taken {
		r.Done()
	}
	failed := 0
	for range 2 {
		if recv(t, errs) != nil {
			failed++
		}
	}
	assert.Equal(t, 1, failed, "each returns the outcome its taker set")
	assert.Equal(t, 3, c.Queued(), "the others wait on")
	close(g.release)
	for range 4 {
		require.NoError(t, recv(t, errs))
	}
	require.Len(t, g.batches, 2)
	assert.ElementsMatch(t, []int{2, 4, 5}, g.batches[1], "the lane sent none of those taken")
	assert.Zero(t, c.calm.Load(), "none in no hurry is left")
}

// recv takes a caller's outcome, failing the test if none comes.
func recv(t *testing.T, errs <-chan error) error {
	t.Helper()
	select {
	case err := <-errs:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("no outcome")
		return nil
	}
}

// Requests in no hurry go at once when they fill a batch, or when as many
// are queued as the first two asked for.
func TestLaneSendsRequestsInNoHurryOnceEnoughCame(t *testing.T) {
	for _, tc := range []struct{ max, enough int }{{3, 0}, {100, 3}} {
		g := openGate()
		c := NewLane(tc.max, 1, g.flush)
		ctx := context.Background()
		errs := make(chan error, 2)
		for in := range 2 {
			go func() { errs <- c.DoWithin(ctx, in, time.Hour, tc.enough) }()
		}
		queued(t, c, 2)
		assert.Empty(t, g.batches, "not enough yet")
		require.NoError(t, c.DoWithin(ctx, 2, time.Hour, 0))
		for range 2 {
			require.NoError(t, recv(t, errs))
		}
		require.Len(t, g.batches, 1, "%+v", tc)
		assert.ElementsMatch(t, []int{0, 1, 2}, g.batches[0])
		c.wait.Stop()
	}
}

// Requests in no hurry queued behind a batch in flight, none of them due,
// wait when it returns, rather than go at once in a batch of their own.
func TestLaneHoldsRequestsInNoHurryQueuedBehindABatch(t *testing.T) {
	g, c, errs := heldLane(2)
	ctx := context.Background()
	go func() { errs <- c.DoWithin(ctx, 1, time.Hour, 0) }()
	queued(t, c, 1)
	close(g.release)
	require.NoError(t, recv(t, errs))
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.busy == 0 && c.waiting
	}, 10*time.Second, time.Millisecond, "the lane waits for company")
	assert.Equal(t, 1, c.Queued())
	require.NoError(t, c.Do(ctx, 2))
	require.NoError(t, recv(t, errs))
	require.Len(t, g.batches, 2)
	assert.Equal(t, []int{0}, g.batches[0])
	assert.ElementsMatch(t, []int{1, 2}, g.batches[1])
	c.wait.Stop()
}

func TestLaneBoundsABatch(t *testing.T) {
	g := newGate()
	c := NewLane(2, 1, g.flush)
	ctx := context.Background()
	var wg sync.WaitGroup
	do := func(in int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.NoError(t, c.Do(ctx, in))
		}()
	}
	do(0)
	<-g.held
	for in := 1; in <= 5; in++ {
		do(in)
	}
	queued(t, c, 5)
	close(g.release)
	wg.Wait()
	var sizes []int
	for _, b := range g.batches {
		sizes = append(sizes, len(b))
	}
	assert.Equal(t, []int{1, 2, 2, 1}, sizes)
}

func TestLaneDropsACallCancelledWhileQueued(t *testing.T) {
	g := newGate()
	c := NewLane(100, 1, g.flush)
	first := make(chan error, 1)
	go func() { first <- c.Do(context.Background(), 0) }()
	<-g.held
	ctx, cancel := context.WithCancel(context.Background())
	cancelled := make(chan error, 1)
	go func() { cancelled <- c.Do(ctx, 1) }()
	queued(t, c, 1)
	cancel()
	assert.ErrorIs(t, <-cancelled, context.Canceled)
	close(g.release)
	require.NoError(t, <-first)
	assert.Equal(t, [][]int{{0}}, g.batches, "the cancelled call was never sent")
	assert.NoError(t, c.Do(context.Background(), 2), "the lane is free again")
}

func TestLaneKeepsUpToInflightBatchesInFlight(t *testing.T) {
	var mu sync.Mutex
	inFlight, most := 0, 0
	release := make(chan struct{})
	c := NewLane(100, 2, func(_ context.Context, batch []*Request[int]) {
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		mu.Unlock()
		<-release
		mu.Lock()
		inFlight--
		mu.Unlock()
	})
	ctx := context.Background()
	errs := make(chan error, 5)
	for in := range 5 {
		go func() { errs <- c.Do(ctx, in) }()
	}
	queued(t, c, 3) // two batches in flight, three callers behind them
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return inFlight == 2
	}, 10*time.Second, time.Millisecond)
	close(release)
	for range 5 {
		require.NoError(t, <-errs)
	}
	assert.Equal(t, 2, most)
}

func TestLanesSpreadDestinationsByModulo(t *testing.T) {
	lanes := NewLanes(3, 10, 1, func(context.Context, []*Request[int]) {})
	require.Len(t, lanes, 3)
	assert.Same(t, lanes[1], lanes.For(1))
	assert.Same(t, lanes[1], lanes.For(4))
	assert.NotSame(t, lanes.For(0), lanes.For(1))
}

func TestGroupByKeepsOrderAndSplitsAtTheLimit(t *testing.T) {
	var batch []*Request[string]
	for _, in := range []string{"a1", "b2", "a3", "a4", "b1"} {
		batch = append(batch, &Request[string]{In: in})
	}
	groups := GroupBy(batch,
		func(s string) byte { return s[0] },
		func(s string) int { return int(s[1] - '0') }, 5)
	var got [][]string
	for _, g := range groups {
		var ins []string
		for _, r := range g.Reqs {
			ins = append(ins, r.In)
		}
		got = append(got, ins)
	}
	// a1+a3 = 4 fits; a4 would make 8 > 5: a new group for "a". b2+b1 = 3.
	assert.Equal(t, [][]string{{"a1", "a3"}, {"b2", "b1"}, {"a4"}}, got)
	assert.Equal(t, []int{4, 3, 4}, []int{groups[0].Size, groups[1].Size, groups[2].Size})
	assert.Equal(t, byte('a'), groups[2].Key)
}

func TestInputsKeepsTheOrder(t *testing.T) {
	reqs := []*Request[string]{{In: "a"}, {In: "b"}, {In: "c"}}
	assert.Equal(t, []string{"a", "b", "c"}, Inputs(reqs))
	assert.Empty(t, Inputs[string](nil))
}
