package delayqueue

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestScheduleTicksOnceThroughKilledProcesses runs an every-200ms schedule
// in mover processes that are killed (SIGKILL) and restarted at random,
// at least two running at any time: every tick's job comes exactly once,
// none skipped. Then every process is killed for longer than twice a
// lease (an outage, as the schedules count one): the ticks of the outage
// give at most one job. The lease is 2 s, so that a test machine that
// starves every process for a second or two does not look like an outage.
func TestScheduleTicksOnceThroughKilledProcesses(t *testing.T) {
	s, name := redistest.Shared(t), uniqueName(t)
	q := newQueue(t, s.Client(t), WithName(name)) // schedules and consumes; never started
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const every = 200
	var mu sync.Mutex
	ticks := map[int64]int{} // tick -> deliveries of its job
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			job, err := q.Pop(ctx, "tick", 100*time.Millisecond)
			if err != nil {
				if !errors.Is(err, ErrNoJob) && ctx.Err() == nil {
					t.Errorf("pop: %v", err)
				}
				continue
			}
			assert.Equal(t, q.tickID("beat", job.RunAt.UnixMilli()), job.ID)
			mu.Lock()
			ticks[job.RunAt.UnixMilli()]++
			mu.Unlock()
			if err := q.Finish(ctx, job.ID); ctx.Err() == nil {
				assert.NoError(t, err)
			}
		}
	}()
	spawn := func() *child {
		c := startChild(t, "mover", s.Addr, name, "DQ_LEASE=2s")
		c.expect(t, "started")
		return c
	}
	kill := func(c *child) {
		c.signal(t, syscall.SIGKILL)
		_ = c.cmd.Wait()
	}
	movers := []*child{spawn(), spawn(), spawn()}
	require.NoError(t, q.Schedule(ctx, Schedule{Name: "beat", Every: every * time.Millisecond, Job: Job{Topic: "tick"}}))
	first := serverMs(t, s.Client(t))

	for range scale(8, 40) {
		time.Sleep(time.Duration(200+rand.IntN(500)) * time.Millisecond) // the churn's pace, not a wait for a condition
		i := rand.IntN(len(movers))
		kill(movers[i])
		movers[i] = spawn()
	}
	churned := serverMs(t, s.Client(t))
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return ticks[(churned/every+1)*every] > 0
	}, 10*time.Second, time.Millisecond)
	mu.Lock()
	for tick := (first/every + 1) * every; tick <= churned; tick += every {
		assert.Equal(t, 1, ticks[tick], "tick %d while processes ran", tick)
	}
	mu.Unlock()

	// Every process down for longer than twice their lease.
	for _, c := range movers {
		kill(c)
	}
	down := serverMs(t, s.Client(t))
	time.Sleep(6 * time.Second) // the outage itself
	up := serverMs(t, s.Client(t))
	movers = []*child{spawn()}
	// The outage ends when the restarted process first reaches Redis,
	// which its schedule's bucket records (move.lua).
	var started int64
	watched := q.keys.bucket(bucketOf("beat", q.opts.buckets)).watched
	require.Eventually(t, func() bool {
		v, err := s.Client(t).Get(ctx, watched).Result()
		since, _, ok := strings.Cut(v, " ")
		started, _ = strconv.ParseInt(since, 10, 64)
		return err == nil && ok && started > up
	}, 10*time.Second, time.Millisecond)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return ticks[(started/every+3)*every] > 0
	}, 10*time.Second, time.Millisecond)
	cancel()
	<-done
	var during int
	for tick, n := range ticks {
		assert.Equal(t, 1, n, "tick %d", tick)
		if tick > down && tick < started {
			during++
		}
	}
	assert.LessOrEqual(t, during, 1, "jobs for the ticks of a %dms outage", started-down)
	for tick := (started/every + 1) * every; tick <= (started/every+3)*every; tick += every {
		assert.Equal(t, 1, ticks[tick], "tick %d after the outage", tick)
	}
}
