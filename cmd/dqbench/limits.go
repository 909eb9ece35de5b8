package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
)

// Scenario lim: how much of a topic's limits a backlog uses, and what a
// limit costs Redis. Three consumers, each a DelayQueue on a client of its
// own (as three processes would be), each Consume with 16 handlers that
// take limHandler per job, work off a backlog: once under a rate limit,
// once under a concurrency limit, and once with no limit and about as many
// handlers as the concurrency limit lets run, for the cost per job.
// It runs only when named: go run ./cmd/dqbench -only lim -runs 3

var namedScenarios = []scenario{
	{"lim", "topic limits: use of a rate and a concurrency limit, and their cost", limitsUse},
}

const (
	limHandler     = 20 * time.Millisecond
	limRate        = 200 // per second
	limRateJobs    = 1_200
	limConcurrency = 8
	limConcJobs    = 1_500
)

func limitsUse(ctx context.Context, b *bench) (figures, error) {
	var out figures
	// Rate: a backlog of n jobs under R per Per leaves at best in bursts of
	// R, one per Per: the last starts (n/R - 1) Per after the first. The
	// share is that span over the one measured.
	starts, _, cpu, sent, err := b.limitRun(ctx, delayqueue.Limits{Rate: limRate}, limRateJobs, []int{16, 16, 16})
	if err != nil {
		return nil, err
	}
	first := slices.MinFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	last := slices.MaxFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	ideal := float64(limRateJobs-limRate) / limRate // seconds
	achieved := ideal * limRate / last.Sub(first).Seconds()
	out = append(out,
		figure{"rate limit: achieved share of Rate (200/s)", "%", 100 * achieved / limRate},
		figure{"rate limit: Redis CPU per job", "µs", cpu},
		figure{"rate limit: commands sent per job", "", sent})

	// Concurrency: handler time over wall time (first start to last end).
	_, running, cpu, sent, err := b.limitRun(ctx, delayqueue.Limits{Concurrency: limConcurrency}, limConcJobs, []int{16, 16, 16})
	if err != nil {
		return nil, err
	}
	out = append(out,
		figure{"concurrency limit: time-averaged running share of Concurrency (8)", "%", 100 * running / limConcurrency},
		figure{"concurrency limit: Redis CPU per job", "µs", cpu},
		figure{"concurrency limit: commands sent per job", "", sent})

	// No limit, 3+3+2 handlers: the same work without the limit.
	_, running, cpu, sent, err = b.limitRun(ctx, delayqueue.Limits{}, limConcJobs, []int{3, 3, 2})
	if err != nil {
		return nil, err
	}
	out = append(out,
		figure{"no limit (3+3+2 handlers): time-averaged running share of 8", "%", 100 * running / limConcurrency},
		figure{"no limit (3+3+2 handlers): Redis CPU per job", "µs", cpu},
		figure{"no limit (3+3+2 handlers): commands sent per job", "", sent})
	return out, nil
}

// limitRun pushes n jobs under limits l, consumes them with one queue per
// entry of handlers (its Consume's Concurrency), and returns the handlers'
// start times, the time-averaged number running, and Redis's CPU (µs) and
// commands sent per job.
func (b *bench) limitRun(ctx context.Context, l delayqueue.Limits, n int, handlers []int) ([]time.Time, float64, float64, float64, error) {
	name := b.queueName("lim")
	var qs []*delayqueue.DelayQueue
	for range handlers {
		var c redis.UniversalClient
		if b.cluster {
			c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: b.addrs, PoolSize: 64})
		} else {
			c = redis.NewClient(&redis.Options{Addr: b.addrs[0], PoolSize: 64})
		}
		defer c.Close()
		q, err := delayqueue.New(c, delayqueue.WithName(name))
		if err != nil {
			return nil, 0, 0, 0, err
		}
		defer q.Close(context.WithoutCancel(ctx))
		if err := q.Start(ctx); err != nil {
			return nil, 0, 0, 0, err
		}
		qs = append(qs, q)
	}
	if err := qs[0].SetLimits(ctx, "lim", l); err != nil {
		return nil, 0, 0, 0, err
	}
	body := body()
	jobs := make([]*delayqueue.Job, n)
	for i := range jobs {
		jobs[i] = &delayqueue.Job{Topic: "lim", Body: body}
	}
	for i := 0; i < n; i += 500 {
		if _, err := qs[0].PushMany(ctx, jobs[i:min(i+500, n)]); err != nil {
			return nil, 0, 0, 0, err
		}
	}
	before, err := b.commandCalls(ctx)
	if err != nil {
		return nil, 0, 0, 0, err
	}
	var mu sync.Mutex
	starts := make([]time.Time, 0, n)
	var lastEnd time.Time
	var busy time.Duration
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	g, gctx := errgroup.WithContext(cctx)
	for i, q := range qs {
		g.Go(func() error {
			err := q.Consume(gctx, "lim", func(context.Context, *delayqueue.Job) error {
				start := time.Now()
				time.Sleep(limHandler) // the work
				end := time.Now()
				mu.Lock()
				defer mu.Unlock()
				starts = append(starts, start)
				busy += end.Sub(start)
				if end.After(lastEnd) {
					lastEnd = end
				}
				if len(starts) == n {
					cancel()
				}
				return nil
			}, delayqueue.ConsumeOptions{Concurrency: handlers[i]})
			if errors.Is(err, context.Canceled) {
				err = nil
			}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, 0, 0, 0, err
	}
	if len(starts) < n {
		return nil, 0, 0, 0, fmt.Errorf("lim: %d of %d jobs consumed in time", len(starts), n)
	}
	after, err := b.commandCalls(ctx)
	if err != nil {
		return nil, 0, 0, 0, err
	}
	d := after.sub(before)
	first := slices.MinFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	running := busy.Seconds() / lastEnd.Sub(first).Seconds()
	return starts, running, d.cpu * 1e6 / float64(n), float64(d.sent) / float64(n), nil
}
