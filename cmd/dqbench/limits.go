package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/redis/go-redis/v9"
)

// Scenario lim: how much of a topic's limits a backlog uses, and what a
// limit costs Redis. Three consumer processes (children, see protocol.go),
// each Consume with 16 handlers that take limHandler per job, work off a
// backlog: once under a rate limit, once under a concurrency limit, and once
// with no limit and about as many handlers as the concurrency limit lets
// run, for the cost per job. It runs only when named: go run ./cmd/dqbench
// -only lim -runs 3

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

// limitRun pushes n jobs under limits l, consumes them with one consumer
// process per entry of handlers (its Consume's Concurrency; each handler
// takes limHandler), and returns the handlers' start times, the
// time-averaged number running, and Redis's CPU (µs) and commands sent per
// job.
func (b *bench) limitRun(ctx context.Context, l delayqueue.Limits, n int, handlers []int) ([]time.Time, float64, float64, float64, error) {
	name := b.queueName("lim")
	var c redis.UniversalClient
	if b.cluster {
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: b.addrs})
	} else {
		c = redis.NewClient(&redis.Options{Addr: b.addrs[0]})
	}
	defer c.Close()
	q, err := delayqueue.New(c, delayqueue.WithName(name))
	if err != nil {
		return nil, 0, 0, 0, err
	}
	defer q.Close(context.WithoutCancel(ctx))
	if err := q.SetLimits(ctx, layoutTopic, l); err != nil {
		return nil, 0, 0, 0, err
	}
	jobs := make([]*delayqueue.Job, n)
	for i := range jobs {
		jobs[i] = &delayqueue.Job{Topic: layoutTopic, Body: jobBody(i, 0)}
	}
	for i := 0; i < n; i += 500 {
		if _, err := q.PushMany(ctx, jobs[i:min(i+500, n)]); err != nil {
			return nil, 0, 0, 0, err
		}
	}
	before, err := b.commandCalls(ctx)
	if err != nil {
		return nil, 0, 0, 0, err
	}
	got := newReceipts(n)
	f := newFleet(got)
	defer f.kill()
	for i, h := range handlers {
		if _, err := f.start(fmt.Sprintf("consumer %d", i+1), "consumer",
			"-addrs", strings.Join(b.addrs, ","), "-cluster="+strconv.FormatBool(b.cluster), "-queue", name,
			"-impl", "dq", "-method", "consume", "-start", "-timeout", "5m",
			"-handlers", strconv.Itoa(h), "-work", limHandler.String()); err != nil {
			return nil, 0, 0, 0, err
		}
	}
	if err := f.waitReady(ctx, time.Minute); err != nil {
		return nil, 0, 0, 0, err
	}
	wait := time.NewTimer(5 * time.Minute)
	defer wait.Stop()
	select {
	case <-got.all:
	case <-wait.C:
		return nil, 0, 0, 0, fmt.Errorf("lim: %d of %d jobs consumed in time", got.distinct, n)
	case <-ctx.Done():
		return nil, 0, 0, 0, ctx.Err()
	}
	// Stopped, the consumers let their running handlers end.
	if err := f.stop(ctx, time.Minute); err != nil {
		return nil, 0, 0, 0, err
	}
	after, err := b.commandCalls(ctx)
	if err != nil {
		return nil, 0, 0, 0, err
	}
	if len(f.spans) < n {
		return nil, 0, 0, 0, fmt.Errorf("lim: %d of %d handlers reported", len(f.spans), n)
	}
	starts := make([]time.Time, len(f.spans))
	var busy time.Duration
	var lastEnd time.Time
	for i, sp := range f.spans {
		starts[i] = sp.start
		busy += sp.end.Sub(sp.start)
		if sp.end.After(lastEnd) {
			lastEnd = sp.end
		}
	}
	d := after.sub(before)
	first := slices.MinFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	running := busy.Seconds() / lastEnd.Sub(first).Seconds()
	return starts, running, d.cpu * 1e6 / float64(n), float64(d.sent) / float64(n), nil
}
