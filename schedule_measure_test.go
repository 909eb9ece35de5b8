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
// 10s) and the Redis cost of 1,000 idle schedules over 30s. Run with
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
		var late []time.Duration
		obs := ObserverFunc(func(_ context.Context, e Event) {
			if e.Kind == EventReserved && e.Lateness >= 0 {
				mu.Lock()
				late = append(late, e.Lateness)
				mu.Unlock()
			}
		})
		q := newQueue(t, s.Client(t), WithObserver(obs))
		startQueue(t, q)
		require.NoError(t, q.Schedule(ctx, Schedule{Name: "m", Every: 100 * time.Millisecond, Job: Job{Topic: "m"}}))
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_ = q.Consume(cctx, "m", func(context.Context, *Job) error { return nil }, ConsumeOptions{})
		cancel()
		mu.Lock()
		slices.Sort(late)
		fmt.Printf("run %d: %d ticks, lateness median %v, p99 %v, worst %v\n", run, len(late),
			late[len(late)/2], late[len(late)*99/100], late[len(late)-1])
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
