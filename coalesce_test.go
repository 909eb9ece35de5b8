package delayqueue

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

func (g *gate) flush(_ context.Context, batch []*request[int]) {
	g.mu.Lock()
	var ins []int
	for _, r := range batch {
		ins = append(ins, r.in)
		if r.in < 0 {
			r.err = errors.New("refused")
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

// queued waits until n requests wait behind the batch in flight.
func queued[T any](t *testing.T, c *coalescer[T], n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.queue) == n
	}, 10*time.Second, time.Millisecond)
}

func TestCoalescerSendsQueuedCallsAsOneBatch(t *testing.T) {
	g := newGate()
	c := &coalescer[int]{max: 100, flush: g.flush}
	ctx := context.Background()
	errs := make(chan error, 6)
	go func() { errs <- c.do(ctx, 0) }()
	<-g.held
	for _, in := range []int{1, 2, -3, 4, 5} {
		go func() { errs <- c.do(ctx, in) }()
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

func TestCoalescerBoundsABatch(t *testing.T) {
	g := newGate()
	c := &coalescer[int]{max: 2, flush: g.flush}
	ctx := context.Background()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		assert.NoError(t, c.do(ctx, 0))
	}()
	<-g.held
	for in := 1; in <= 5; in++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.NoError(t, c.do(ctx, in))
		}()
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

func TestCoalescerDropsACallCancelledWhileQueued(t *testing.T) {
	g := newGate()
	c := &coalescer[int]{max: 100, flush: g.flush}
	first := make(chan error, 1)
	go func() { first <- c.do(context.Background(), 0) }()
	<-g.held
	ctx, cancel := context.WithCancel(context.Background())
	cancelled := make(chan error, 1)
	go func() { cancelled <- c.do(ctx, 1) }()
	queued(t, c, 1)
	cancel()
	assert.ErrorIs(t, <-cancelled, context.Canceled)
	close(g.release)
	require.NoError(t, <-first)
	assert.Equal(t, [][]int{{0}}, g.batches, "the cancelled call was never sent")
	assert.NoError(t, c.do(context.Background(), 2), "the coalescer is free again")
}
