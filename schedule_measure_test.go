package delayqueue

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestMeasureSchedules prints the figures of BENCHMARKS.md's "Periodic
// schedules": the lateness of an every-100ms schedule's ticks (3 runs of
// 10s), beside that of plain delayed jobs due as often, pushed a second
// ahead, on the same queue at the same time (so that a machine's load
// shows in both, and what the schedules add in the difference), and the
// Redis cost of 1,000 idle schedules over 30s. Run with
//
//	DQ_MEASURE=1 go test -run TestMeasureSchedules -v .
func TestMeasureSchedules(t *testing.T) {
	if os.Getenv("DQ_MEASURE") != "1" {
		t.Skip("set DQ_MEASURE=1 to measure")
	}
	ctx := context.Background()
	s := redistest.Shared(t)
	for run := 1; run <= 3; run++ {
		var mu sync.Mutex
		late := map[string][]time.Duration{}
		obs := ObserverFunc(func(_ context.Context, e Event) {
			if e.Kind == EventReserved && e.Lateness >= 0 {
				mu.Lock()
				late[e.Topic] = append(late[e.Topic], e.Lateness)
				mu.Unlock()
			}
		})
		q := newQueue(t, s.Client(t), WithObserver(obs))
		startQueue(t, q)
		require.NoError(t, q.Schedule(ctx, Schedule{Name: "m", Every: 100 * time.Millisecond, Job: Job{Topic: "m"}}))
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { // a delayed job due every 100ms, half-way between ticks, pushed 1s ahead
			defer wg.Done()
			due := time.Now().Truncate(100 * time.Millisecond).Add(time.Second + 50*time.Millisecond)
			timer := time.NewTimer(0)
			defer timer.Stop()
			for {
				select {
				case <-cctx.Done():
					return
				case <-timer.C:
				}
				if _, err := q.Push(cctx, &Job{Topic: "d", RunAt: due}); err != nil && cctx.Err() == nil {
					t.Errorf("push: %v", err)
				}
				due = due.Add(100 * time.Millisecond)
				timer.Reset(time.Until(due.Add(-time.Second)))
			}
		}()
		go func() {
			defer wg.Done()
			_ = q.Consume(cctx, "d", func(context.Context, *Job) error { return nil }, ConsumeOptions{})
		}()
		_ = q.Consume(cctx, "m", func(context.Context, *Job) error { return nil }, ConsumeOptions{})
		wg.Wait()
		cancel()
		mu.Lock()
		for _, topic := range []string{"m", "d"} {
			l := late[topic]
			slices.Sort(l)
			what := map[string]string{"m": "ticks", "d": "delayed jobs"}[topic]
			fmt.Printf("run %d: %d %s, lateness median %v, p99 %v, worst %v\n", run, len(l), what,
				l[len(l)/2], l[len(l)*99/100], l[len(l)-1])
		}
		mu.Unlock()
		closeQueue(t, q)
	}

	q := newQueue(t, s.Client(t))
	for i := range 1000 {
		require.NoError(t, q.Schedule(ctx, Schedule{Name: "idle" + strconv.Itoa(i), Every: 24 * time.Hour, Job: Job{Topic: "idle"}}))
	}
	startQueue(t, q)
	time.Sleep(time.Second) // the start's own looks
	c := s.Client(t)
	calls0, cpu0 := redisCost(t, c)
	time.Sleep(30 * time.Second) // the measured period
	calls1, cpu1 := redisCost(t, c)
	fmt.Printf("1,000 idle schedules, one started process: %.1f commands/s, Redis CPU %.2f%%\n",
		float64(calls1-calls0)/30, (cpu1-cpu0)/30*100)
}

// redisCost reads the server's total commands processed and CPU seconds.
func redisCost(t *testing.T, c redis.UniversalClient) (int64, float64) {
	info, err := c.Info(context.Background(), "stats", "cpu").Result()
	require.NoError(t, err)
	var calls int64
	var cpu float64
	for _, line := range strings.Split(info, "\r\n") {
		k, v, _ := strings.Cut(line, ":")
		switch k {
		case "total_commands_processed":
			calls, _ = strconv.ParseInt(v, 10, 64)
		case "used_cpu_sys", "used_cpu_user":
			f, _ := strconv.ParseFloat(v, 64)
			cpu += f
		}
	}
	return calls, cpu
}
