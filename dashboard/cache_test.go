package dashboard

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeQueue's Overview counts its calls; each takes took on the fake
// clock, and, while hold is set, waits until it is closed.
type fakeQueue struct {
	mu    sync.Mutex
	now   time.Time
	calls int
	took  time.Duration
	hold  chan struct{}
	err   error
}

func (f *fakeQueue) clock() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeQueue) advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

func (f *fakeQueue) overview(context.Context) (figures, error) {
	f.mu.Lock()
	f.calls++
	n, hold, err := f.calls, f.hold, f.err
	f.now = f.now.Add(f.took)
	f.mu.Unlock()
	if hold != nil {
		<-hold
	}
	return figures{Overview: delayqueue.Overview{Jobs: n}}, err
}

func (f *fakeQueue) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func newFakeCache() (*overviewCache, *fakeQueue) {
	f := &fakeQueue{now: time.Unix(1_000_000, 0), took: 10 * time.Millisecond}
	c := newOverviewCache(f.overview)
	c.now = f.clock
	return c, f
}

func TestOverviewIsKeptForAMoment(t *testing.T) {
	ctx := context.Background()
	c, f := newFakeCache()
	get := func() int {
		t.Helper()
		s, err := c.get(ctx)
		require.NoError(t, err)
		return s.Jobs // the number of the call that read it
	}
	assert.Equal(t, 1, get())
	f.advance(freshFor - 20*time.Millisecond) // from the call's start
	assert.Equal(t, 1, get(), "kept")
	f.advance(10 * time.Millisecond)
	assert.Equal(t, 2, get(), "read anew after freshFor")

	// A slow call is kept for freshPerCall times its length.
	f.took = time.Second
	f.advance(freshFor)
	assert.Equal(t, 3, get())
	f.advance(freshPerCall*time.Second - time.Second - time.Millisecond)
	assert.Equal(t, 3, get(), "kept for 20 s")
	f.advance(time.Millisecond)
	assert.Equal(t, 4, get())

	// An action drops it.
	c.drop()
	assert.Equal(t, 5, get())
	assert.Equal(t, 5, get())
}

func TestOverviewErrorsAreNotKept(t *testing.T) {
	ctx := context.Background()
	c, f := newFakeCache()
	f.err = errors.New("connection refused")
	_, err := c.get(ctx)
	assert.ErrorIs(t, err, f.err)
	f.err = nil
	s, err := c.get(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, s.Jobs)
}

// waiting counts the requests waiting on a call under way.
func waiting(c *overviewCache, n int) func() bool {
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.flight != nil && c.flight.waiting == n
	}
}

func TestOneOverviewCallServesAllWhoWait(t *testing.T) {
	c, f := newFakeCache()
	f.hold = make(chan struct{})
	const n = 8
	got := make(chan int, n)
	leaderCtx, leave := context.WithCancel(context.Background())
	go func() {
		s, err := c.get(leaderCtx)
		if err != nil {
			got <- -1
			return
		}
		got <- s.Jobs
	}()
	require.Eventually(t, func() bool { return f.callCount() == 1 }, 10*time.Second, time.Millisecond)
	for range n - 1 {
		go func() {
			s, err := c.get(context.Background())
			if err != nil {
				got <- -1
				return
			}
			got <- s.Jobs
		}()
	}
	require.Eventually(t, waiting(c, n-1), 10*time.Second, time.Millisecond)
	leave() // the request that made the call goes: the call goes on for the others
	close(f.hold)
	for range n {
		assert.Equal(t, 1, <-got)
	}
	assert.Equal(t, 1, f.callCount())
}

// TestADropIsNotAnsweredByAnEarlierCall: a request after an action does
// not take the figures of a call that began before it.
func TestADropIsNotAnsweredByAnEarlierCall(t *testing.T) {
	c, f := newFakeCache()
	hold := make(chan struct{})
	f.hold = hold
	first := make(chan int, 1)
	go func() {
		s, err := c.get(context.Background())
		if err != nil {
			first <- -1
			return
		}
		first <- s.Jobs
	}()
	require.Eventually(t, func() bool { return f.callCount() == 1 }, 10*time.Second, time.Millisecond)
	c.drop()
	f.mu.Lock()
	f.hold = nil // the second call does not wait
	f.mu.Unlock()
	s, err := c.get(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 2, s.Jobs)
	close(hold)
	assert.Equal(t, 1, <-first)
	s, err = c.get(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 2, s.Jobs, "the later call's figures are kept")
}

// TestAPanickingCallLetsTheWaitingGo: those waiting for a call that
// panicked are told, and the next request reads anew.
func TestAPanickingCallLetsTheWaitingGo(t *testing.T) {
	c, f := newFakeCache()
	hold := make(chan struct{})
	f.hold = hold
	fetch := c.fetch
	c.fetch = func(ctx context.Context) (figures, error) {
		ov, _ := fetch(ctx)
		if ov.Jobs == 1 {
			panic("the queue's Overview panicked")
		}
		return ov, nil
	}
	leader := make(chan any, 1)
	go func() {
		defer func() { leader <- recover() }()
		_, _ = c.get(context.Background())
	}()
	require.Eventually(t, func() bool { return f.callCount() == 1 }, 10*time.Second, time.Millisecond)
	waiter := make(chan error, 1)
	go func() {
		_, err := c.get(context.Background())
		waiter <- err
	}()
	require.Eventually(t, waiting(c, 1), 10*time.Second, time.Millisecond)
	f.mu.Lock()
	f.hold = nil
	f.mu.Unlock()
	close(hold)
	assert.NotNil(t, <-leader)
	assert.ErrorIs(t, <-waiter, errNoOverview)
	s, err := c.get(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 2, s.Jobs)
}
