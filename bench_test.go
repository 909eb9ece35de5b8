package delayqueue

import (
	"context"
	"testing"
	"time"

	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/stretchr/testify/require"
)

// Benchmarks on a real redis-server (started by the harness). The figures
// that BENCHMARKS.md quotes come from cmd/dqbench; these are for comparing
// changes with benchstat:
//
//	go test -run '^$' -bench . -count 10 . | tee new.txt

func benchQueue(b *testing.B) *DelayQueue {
	return newQueue(b, redistest.Shared(b).Client(b))
}

var benchBody = make([]byte, 128)

// BenchmarkPush pushes one job at a time from one goroutine: one round trip
// per job.
func BenchmarkPush(b *testing.B) {
	q, ctx := benchQueue(b), context.Background()
	b.ResetTimer()
	for range b.N {
		_, err := q.Push(ctx, &Job{Topic: "t", Body: benchBody, Delay: time.Hour})
		require.NoError(b, err)
	}
}

// BenchmarkPushParallel pushes from many goroutines, whose calls share
// round trips and script calls.
func BenchmarkPushParallel(b *testing.B) {
	q, ctx := benchQueue(b), context.Background()
	b.SetParallelism(8) // 8 goroutines per core
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, err := q.Push(ctx, &Job{Topic: "t", Body: benchBody, Delay: time.Hour})
			require.NoError(b, err)
		}
	})
}

// BenchmarkPushPopFinishParallel takes jobs due now through Push, Pop and
// Finish from many goroutines.
func BenchmarkPushPopFinishParallel(b *testing.B) {
	q, ctx := benchQueue(b), context.Background()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, err := q.Push(ctx, &Job{Topic: "t", Body: benchBody})
			require.NoError(b, err)
			job, err := q.Pop(ctx, "t", time.Second)
			require.NoError(b, err)
			require.NoError(b, q.Finish(ctx, job.ID))
		}
	})
}

func BenchmarkDecodeJob(b *testing.B) {
	v := encodeJob("orders", benchBody, 30000, 10, 1700000000000, 0, 0, nil)
	for range b.N {
		if _, err := decodeJob("5W1D22agZEq", v); err != nil {
			b.Fatal(err)
		}
	}
}
