package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dqueue/delayqueue"
	"golang.org/x/sync/errgroup"
)

var scenarios = []scenario{
	{"s1", "push, single calls", pushSingle},
	{"s1b", "push, PushMany of 100", pushBatched},
	{"s2", "delivery lateness", lateness},
	{"s3", "end to end, due now, Consume", endToEndConsume},
	{"s3p", "end to end, due now, Pop and Finish", endToEndPop},
	{"s4", "memory per pending job", memory},
	{"s5", "idle cost", idle},
	{"s6", "cost growth with pending jobs", growth},
	{"s7", "a backlog due at once", backlog},
	{"s8", "the dashboard's overview of many topics", overviewCost},
}

var latenessJobs = 20_000

const (
	bodySize  = 128
	producers = 16
	workers   = 16
)

// body returns a 128-byte body of random letters.
func body() []byte {
	b := make([]byte, bodySize)
	for i := range b {
		b[i] = byte('a' + rand.IntN(26))
	}
	return b
}

// open opens a queue of its own for a scenario, with what -observe
// attaches; close it with b.close.
func (b *bench) open(name string, opts ...delayqueue.Option) (*delayqueue.DelayQueue, error) {
	q, detach, err := openObserved(b.observe, func(more ...delayqueue.Option) (*delayqueue.DelayQueue, error) {
		return delayqueue.New(b.client, slices.Concat([]delayqueue.Option{delayqueue.WithName(b.queueName(name))}, opts, more)...)
	})
	if err != nil {
		return nil, err
	}
	if b.detach == nil {
		b.detach = map[*delayqueue.DelayQueue]func(){}
	}
	b.detach[q] = detach
	return q, nil
}

// close detaches what -observe attached to q, then closes q.
func (b *bench) close(ctx context.Context, q *delayqueue.DelayQueue) error {
	if detach, ok := b.detach[q]; ok {
		detach()
		delete(b.detach, q)
	}
	return q.Close(ctx)
}

// eachByProducers calls f for 0 to n-1 from 16 producer goroutines, each
// taking the next number, until all are done or one fails.
func eachByProducers(ctx context.Context, n int, f func(ctx context.Context, i int) error) error {
	return eachByGoroutines(ctx, producers, n, f)
}

// eachByGoroutines is eachByProducers with g goroutines.
func eachByGoroutines(ctx context.Context, goroutines, n int, f func(ctx context.Context, i int) error) error {
	var next atomic.Int64
	g, ctx := errgroup.WithContext(ctx)
	for range goroutines {
		g.Go(func() error {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return nil
				}
				if err := f(ctx, i); err != nil {
					return err
				}
			}
		})
	}
	return g.Wait()
}

// pushAll pushes n jobs made by mk with 16 producers and returns the time it
// took.
func pushAll(ctx context.Context, q *delayqueue.DelayQueue, n int, mk func(i int) *delayqueue.Job) (time.Duration, error) {
	start := time.Now()
	err := eachByProducers(ctx, n, func(ctx context.Context, i int) error {
		_, err := q.Push(ctx, mk(i))
		return err
	})
	return time.Since(start), err
}

func pushSingle(ctx context.Context, b *bench) (figures, error) {
	return b.pushThroughput(ctx, "s1", func(ctx context.Context, q *delayqueue.DelayQueue, n int, job func() *delayqueue.Job) error {
		_, err := pushAll(ctx, q, n, func(int) *delayqueue.Job { return job() })
		return err
	})
}

func pushBatched(ctx context.Context, b *bench) (figures, error) {
	const batch = 100
	return b.pushThroughput(ctx, "s1b", func(ctx context.Context, q *delayqueue.DelayQueue, n int, job func() *delayqueue.Job) error {
		var next atomic.Int64
		g, ctx := errgroup.WithContext(ctx)
		for range producers {
			g.Go(func() error {
				jobs := make([]*delayqueue.Job, batch)
				for next.Add(batch) <= int64(n) {
					for i := range jobs {
						jobs[i] = job()
					}
					if _, err := q.PushMany(ctx, jobs); err != nil {
						return err
					}
				}
				return nil
			})
		}
		return g.Wait()
	})
}

// pushThroughput times push putting 100,000 jobs of 128 bytes, due in an
// hour, into a fresh queue, and counts the commands it took.
func (b *bench) pushThroughput(ctx context.Context, name string,
	push func(context.Context, *delayqueue.DelayQueue, int, func() *delayqueue.Job) error) (figures, error) {
	const n = 100_000
	q, err := b.open(name)
	if err != nil {
		return nil, err
	}
	defer b.close(ctx, q)
	body := body()
	before, err := b.commandCalls(ctx)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := push(ctx, q, n, func() *delayqueue.Job {
		return &delayqueue.Job{Topic: "bench", Body: body, Delay: time.Hour}
	}); err != nil {
		return nil, err
	}
	took := time.Since(start)
	after, err := b.commandCalls(ctx)
	if err != nil {
		return nil, err
	}
	return append(figures{{"throughput", "jobs/s", n / took.Seconds()}}, after.sub(before).perJob(n)...), nil
}

// consumeAll pops and finishes with 16 workers until n jobs arrived or
// timeout passed; onJob sees each delivery.
func consumeAll(ctx context.Context, q *delayqueue.DelayQueue, n int, timeout time.Duration, onJob func(*delayqueue.Job, time.Time)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var got atomic.Int64
	g, ctx := errgroup.WithContext(ctx)
	for range workers {
		g.Go(func() error {
			for got.Load() < int64(n) {
				job, err := q.Pop(ctx, "bench", time.Second)
				switch {
				case errors.Is(err, delayqueue.ErrNoJob):
					continue
				case ctx.Err() != nil:
					return nil // timed out: the caller counts what is missing
				case err != nil:
					return err
				}
				at := time.Now()
				if err := q.Finish(ctx, job.ID); err != nil && ctx.Err() == nil {
					return err
				}
				onJob(job, at)
				got.Add(1)
			}
			return nil
		})
	}
	return g.Wait()
}

func lateness(ctx context.Context, b *bench) (figures, error) {
	n := latenessJobs
	q, err := b.open("s2", delayqueue.WithDefaultTTR(time.Minute))
	if err != nil {
		return nil, err
	}
	defer b.close(ctx, q)
	if err := q.Start(ctx); err != nil {
		return nil, err
	}
	base := time.Now().Add(2 * time.Second)
	due := make([]time.Time, n)
	for i := range due {
		due[i] = base.Add(time.Duration(rand.Int64N(int64(4 * time.Second)))).Truncate(time.Millisecond)
	}
	ids := make(map[string]time.Time, n)
	var mu sync.Mutex
	if _, err := pushAll(ctx, q, n, func(i int) *delayqueue.Job {
		return &delayqueue.Job{ID: fmt.Sprintf("s2-%d", i), Topic: "bench", Body: body(), RunAt: due[i]}
	}); err != nil {
		return nil, err
	}
	for i, d := range due {
		ids[fmt.Sprintf("s2-%d", i)] = d
	}
	var lates, serverLates []time.Duration
	seen := map[string]int{}
	early := 0
	err = consumeAll(ctx, q, n, 20*time.Second, func(job *delayqueue.Job, at time.Time) {
		mu.Lock()
		defer mu.Unlock()
		d := ids[job.ID]
		seen[job.ID]++
		lates = append(lates, at.Sub(d))
		serverLates = append(serverLates, job.ReservedUntil.Add(-job.TTR).Sub(d))
		// The reservation began on the server's clock at ReservedUntil-TTR.
		if job.ReservedUntil.Add(-job.TTR).Before(d) {
			early++
		}
	})
	if err != nil {
		return nil, err
	}
	dups := 0
	for _, c := range seen {
		dups += c - 1
	}
	slices.Sort(lates)
	slices.Sort(serverLates)
	b.lateness = append(b.lateness, lates)
	return figures{
		{"lateness p50", "ms", percentile(lates, 50)},
		{"lateness p90", "ms", percentile(lates, 90)},
		{"lateness p99", "ms", percentile(lates, 99)},
		{"lateness max", "ms", percentile(lates, 100)},
		{"reserved after due p99, server clock", "ms", percentile(serverLates, 99)},
		{"delivered early", "jobs", float64(early)},
		{"missing", "jobs", float64(n - len(seen))},
		{"duplicated", "jobs", float64(dups)},
	}, nil
}

// endToEndPop runs S3 through 16 goroutines calling Pop and Finish.
func endToEndPop(ctx context.Context, b *bench) (figures, error) {
	return b.endToEnd(ctx, "s3p", func(ctx context.Context, q *delayqueue.DelayQueue, n int, onJob func()) error {
		return consumeAll(ctx, q, n, time.Minute, func(*delayqueue.Job, time.Time) { onJob() })
	})
}

// endToEndConsume runs S3 through Consume with 16 handlers.
func endToEndConsume(ctx context.Context, b *bench) (figures, error) {
	return b.endToEnd(ctx, "s3", func(ctx context.Context, q *delayqueue.DelayQueue, n int, onJob func()) error {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		var got atomic.Int64
		err := q.Consume(ctx, "bench", func(context.Context, *delayqueue.Job) error {
			onJob()
			if got.Add(1) == int64(n) {
				cancel() // the last job: stop fetching; Consume finishes it
			}
			return nil
		}, delayqueue.ConsumeOptions{Concurrency: workers})
		if errors.Is(err, context.Canceled) {
			err = nil
		}
		return err
	})
}

// endToEnd times n jobs due now from push to finish: 16 producers push
// while consume takes them.
func (b *bench) endToEnd(ctx context.Context, name string,
	consume func(ctx context.Context, q *delayqueue.DelayQueue, n int, onJob func()) error) (figures, error) {
	const n = 50_000
	q, err := b.open(name, delayqueue.WithDefaultTTR(time.Minute))
	if err != nil {
		return nil, err
	}
	defer b.close(ctx, q)
	if err := q.Start(ctx); err != nil {
		return nil, err
	}
	body := body()
	before, err := b.commandCalls(ctx)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	var done atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		_, err := pushAll(gctx, q, n, func(int) *delayqueue.Job { return &delayqueue.Job{Topic: "bench", Body: body} })
		return err
	})
	g.Go(func() error {
		return consume(gctx, q, n, func() { done.Add(1) })
	})
	if err := g.Wait(); err != nil {
		return nil, err
	}
	took := time.Since(start)
	if done.Load() != n {
		return nil, fmt.Errorf("delivered %d of %d jobs", done.Load(), n)
	}
	after, err := b.commandCalls(ctx)
	if err != nil {
		return nil, err
	}
	return append(figures{{"throughput", "jobs/s", n / took.Seconds()}}, after.sub(before).perJob(n)...), nil
}

func memory(ctx context.Context, b *bench) (figures, error) {
	const n = 100_000
	q, err := b.open("s4")
	if err != nil {
		return nil, err
	}
	defer b.close(ctx, q)
	before, err := b.usedMemory(ctx)
	if err != nil {
		return nil, err
	}
	body := body()
	if _, err := pushAll(ctx, q, n, func(int) *delayqueue.Job {
		return &delayqueue.Job{Topic: "bench", Body: body, Delay: time.Hour}
	}); err != nil {
		return nil, err
	}
	after, err := b.usedMemory(ctx)
	if err != nil {
		return nil, err
	}
	return figures{{"used_memory per pending job", "bytes", float64(after-before) / n}}, nil
}

func idle(ctx context.Context, b *bench) (figures, error) {
	const window = 60 * time.Second // three blocked-call waits (20 s), six lease renewals
	q, err := b.open("s5")
	if err != nil {
		return nil, err
	}
	defer b.close(ctx, q)
	if err := q.Start(ctx); err != nil {
		return nil, err
	}
	if _, err := pushAll(ctx, q, 1000, func(int) *delayqueue.Job {
		return &delayqueue.Job{Topic: "bench", Body: body(), Delay: time.Hour}
	}); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	consumer := make(chan error, 1)
	go func() {
		for cctx.Err() == nil {
			if _, err := q.Pop(cctx, "bench", time.Minute); err != nil && !errors.Is(err, delayqueue.ErrNoJob) && cctx.Err() == nil {
				consumer <- err
				return
			}
		}
		consumer <- nil
	}()
	// Let start-up settle, then count what an idle process sends. A new
	// queue's first history sample comes within the first interval and
	// jitter (10 s and 1 s by default); later ones wait while the queue is
	// quiet.
	settle := time.NewTimer(12 * time.Second)
	<-settle.C
	before, err := b.commandCalls(ctx)
	if err != nil {
		return nil, err
	}
	wait := time.NewTimer(window)
	<-wait.C
	after, err := b.commandCalls(ctx)
	if err != nil {
		return nil, err
	}
	d := after.sub(before)
	cancel()
	if err := <-consumer; err != nil {
		return nil, err
	}
	return figures{
		{"commands sent per second", "cmd/s", float64(d.sent) / window.Seconds()},
		{"commands run per second, incl. inside scripts", "cmd/s", float64(d.run) / window.Seconds()},
	}, nil
}

// growth measures what a push and a move cost Redis, in microseconds of
// script time per job (INFO commandstats), with 10,000, 100,000 and
// 1,000,000 jobs already pending.
func growth(ctx context.Context, b *bench) (figures, error) {
	const n = 10_000
	var figs figures
	var push, move []float64
	for _, pending := range []int{10_000, 100_000, 1_000_000} {
		if err := b.reset(ctx); err != nil {
			return nil, err
		}
		q, err := b.open("s6")
		if err != nil {
			return nil, err
		}
		body := body()
		if err := pushMany(ctx, q, pending, func() *delayqueue.Job {
			return &delayqueue.Job{Topic: "bench", Body: body, Delay: time.Hour}
		}); err != nil {
			return nil, err
		}

		if err := b.resetStats(ctx); err != nil {
			return nil, err
		}
		if _, err := pushAll(ctx, q, n, func(int) *delayqueue.Job {
			return &delayqueue.Job{Topic: "bench", Body: body, Delay: time.Hour}
		}); err != nil {
			return nil, err
		}
		usec, err := b.scriptUsec(ctx)
		if err != nil {
			return nil, err
		}
		push = append(push, float64(usec)/n)

		due := time.Now().Add(2 * time.Second)
		if err := pushMany(ctx, q, n, func() *delayqueue.Job {
			return &delayqueue.Job{Topic: "bench", Body: body, RunAt: due}
		}); err != nil {
			return nil, err
		}
		if err := b.resetStats(ctx); err != nil {
			return nil, err
		}
		if err := q.Start(ctx); err != nil {
			return nil, err
		}
		if err := b.waitReady(ctx, q, n, time.Minute); err != nil {
			return nil, err
		}
		usec, err = b.scriptUsec(ctx)
		if err != nil {
			return nil, err
		}
		move = append(move, float64(usec)/n)
		if err := b.close(ctx, q); err != nil {
			return nil, err
		}
		figs = append(figs,
			figure{fmt.Sprintf("push, %d pending", pending), "µs of Redis per job", push[len(push)-1]},
			figure{fmt.Sprintf("move, %d pending", pending), "µs of Redis per job", move[len(move)-1]})
	}
	b.growth = append(b.growth, [2][]float64{push, move})
	return append(figs,
		figure{"push cost, 1,000,000 vs 10,000 pending", "%", 100 * (push[2]/push[0] - 1)},
		figure{"move cost, 1,000,000 vs 10,000 pending", "%", 100 * (move[2]/move[0] - 1)},
	), nil
}

// pushMany pushes n jobs with PushMany in batches of 1,000 from 4 goroutines.
func pushMany(ctx context.Context, q *delayqueue.DelayQueue, n int, mk func() *delayqueue.Job) error {
	const batch = 1000
	var next atomic.Int64
	g, ctx := errgroup.WithContext(ctx)
	for range 4 {
		g.Go(func() error {
			for {
				start := int(next.Add(batch)) - batch
				if start >= n {
					return nil
				}
				jobs := make([]*delayqueue.Job, min(batch, n-start))
				for i := range jobs {
					jobs[i] = mk()
				}
				if _, err := q.PushMany(ctx, jobs); err != nil {
					return err
				}
			}
		})
	}
	return g.Wait()
}
