package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/dashboard"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
)

// S8's settings: its topics, and how long each load runs.
var (
	overviewTopics = 10_000
	overviewLoad   = 10 * time.Second
)

const (
	overviewCalls   = 20 // timed one after another
	overviewClients = 8  // refreshing at once
	pingEvery       = 5 * time.Millisecond
)

// overviewCost (S8) measures what the overview of overviewTopics topics
// costs Redis, each topic holding a ready job and a delayed one: the
// Redis time and wall time of an Overview, called overviewCalls times in
// a row; then Redis's CPU and the PING latency another client sees, for
// overviewLoad each: idle, while 8 clients load the dashboard's overview
// page in a loop (through its handler), and while 8 clients call Overview
// in a loop, as each page load did before the dashboard kept its
// Overview.
func overviewCost(ctx context.Context, b *bench) (figures, error) {
	q, err := b.open("s8")
	if err != nil {
		return nil, err
	}
	defer func() { _ = b.close(ctx, q) }()
	body := body()
	var next atomic.Int64
	if err := pushMany(ctx, q, 2*overviewTopics, func() *delayqueue.Job {
		i := int(next.Add(1)) - 1
		job := &delayqueue.Job{Topic: fmt.Sprintf("topic-%05d", i/2), Body: body}
		if i%2 == 1 {
			job.Delay = time.Hour
		}
		return job
	}); err != nil {
		return nil, err
	}

	figs, err := b.timeOverviews(ctx, q)
	if err != nil {
		return nil, err
	}

	pinger := redis.NewClient(&redis.Options{Addr: b.addrs[0], PoolSize: 1})
	defer pinger.Close()
	start, err := b.redisTime(ctx)
	if err != nil {
		return nil, err
	}
	idle, err := pingWhile(ctx, pinger, overviewLoad, func(context.Context) error { return nil })
	if err != nil {
		return nil, err
	}
	end, err := b.redisTime(ctx)
	if err != nil {
		return nil, err
	}
	secs := overviewLoad.Seconds()
	figs = append(figs, figure{"idle: Redis CPU, PINGs and its own timers", "%", (end.cpu - start.cpu) / secs * 100})
	figs = append(figs, pingFigures("idle", idle)...)

	// 8 clients refreshing the overview page.
	counted := &countingQueue{DelayQueue: q}
	srv := httptest.NewServer(http.StripPrefix("/admin/queue", dashboard.New(counted, dashboard.Options{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})))
	defer srv.Close()
	web := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: overviewClients}}
	defer web.CloseIdleConnections()
	var pages, pageBytes atomic.Int64
	load := func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/admin/queue/", nil)
		if err != nil {
			return err
		}
		resp, err := web.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		n, err := io.Copy(io.Discard, resp.Body)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("overview page: %s", resp.Status)
		}
		pages.Add(1)
		pageBytes.Store(n)
		return nil
	}
	if start, err = b.redisTime(ctx); err != nil {
		return nil, err
	}
	loaded, err := pingWhile(ctx, pinger, overviewLoad, inLoop(overviewClients, load))
	if err != nil {
		return nil, err
	}
	if end, err = b.redisTime(ctx); err != nil {
		return nil, err
	}
	figs = append(figs, figures{
		{"dashboard: overview page", "KiB", float64(pageBytes.Load()) / 1024},
		{"dashboard: pages served", "/s", float64(pages.Load()) / secs},
		{"dashboard: Overview calls", "/s", float64(counted.calls.Load()) / secs},
		{"dashboard: Redis CPU", "%", (end.cpu - start.cpu) / secs * 100},
	}...)
	figs = append(figs, pingFigures("8 clients refreshing the dashboard", loaded)...)

	// 8 clients calling Overview, as each page load did.
	if start, err = b.redisTime(ctx); err != nil {
		return nil, err
	}
	bare, err := pingWhile(ctx, pinger, overviewLoad, inLoop(overviewClients, func(ctx context.Context) error {
		_, err := q.Overview(ctx)
		return err
	}))
	if err != nil {
		return nil, err
	}
	if end, err = b.redisTime(ctx); err != nil {
		return nil, err
	}
	figs = append(figs, figure{"8 clients calling Overview: Redis CPU", "%", (end.cpu - start.cpu) / secs * 100})
	return append(figs, pingFigures("8 clients calling Overview", bare)...), nil
}

// timeOverviews calls Overview overviewCalls times in a row, and returns
// the Redis time and wall time of a call, and its longest script call.
func (b *bench) timeOverviews(ctx context.Context, q *delayqueue.DelayQueue) (figures, error) {
	restore, err := b.logEveryCommand(ctx, 64*overviewCalls)
	if err != nil {
		return nil, err
	}
	defer restore()
	before, err := b.redisTime(ctx)
	if err != nil {
		return nil, err
	}
	walls := make([]time.Duration, overviewCalls)
	for i := range walls {
		start := time.Now()
		ov, err := q.Overview(ctx)
		if err != nil {
			return nil, err
		}
		walls[i] = time.Since(start)
		if len(ov.Topics) != overviewTopics {
			return nil, fmt.Errorf("overview of %d topics, not %d", len(ov.Topics), overviewTopics)
		}
	}
	after, err := b.redisTime(ctx)
	if err != nil {
		return nil, err
	}
	calls, err := b.scriptTimes(ctx)
	if err != nil {
		return nil, err
	}
	if len(calls) == 0 {
		return nil, errors.New("SLOWLOG kept no script call")
	}
	slices.Sort(walls)
	slices.Sort(calls)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	perCall := func(secs float64) float64 { return secs * 1000 / overviewCalls }
	return figures{
		{"topics", "", float64(overviewTopics)},
		{"Overview, wall time, median", "ms", ms(walls[len(walls)/2])},
		{"Overview, Redis time in its scripts", "ms", perCall(after.scripts - before.scripts)},
		{"Overview, Redis CPU (INFO cpu)", "ms", perCall(after.cpu - before.cpu)},
		{"Overview, longest script call", "ms", ms(calls[len(calls)-1])},
	}, nil
}

// countingQueue counts the Overview calls of a dashboard.
type countingQueue struct {
	*delayqueue.DelayQueue
	calls atomic.Int64
}

func (c *countingQueue) Overview(ctx context.Context) (delayqueue.Overview, error) {
	c.calls.Add(1)
	return c.DelayQueue.Overview(ctx)
}

// inLoop returns a load of n goroutines each calling f in a loop until
// its context ends.
func inLoop(n int, f func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		g, ctx := errgroup.WithContext(ctx)
		for range n {
			g.Go(func() error {
				for ctx.Err() == nil {
					if err := f(ctx); err != nil && ctx.Err() == nil {
						return err
					}
				}
				return nil
			})
		}
		return g.Wait()
	}
}

// pingWhile runs load for d, and meanwhile sends PING every pingEvery,
// each after the last was answered; it returns their latencies, sorted.
func pingWhile(ctx context.Context, c *redis.Client, d time.Duration, load func(context.Context) error) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	loaded := make(chan error, 1)
	go func() { loaded <- load(ctx) }()
	var lat []time.Duration
	tick := time.NewTicker(pingEvery)
	defer tick.Stop()
	var pingErr error
	for pingErr == nil && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-tick.C:
			start := time.Now()
			if err := c.Ping(ctx).Err(); err != nil && ctx.Err() == nil {
				pingErr = fmt.Errorf("ping: %w", err)
			} else if err == nil {
				lat = append(lat, time.Since(start))
			}
		}
	}
	cancel()
	if err := errors.Join(pingErr, <-loaded); err != nil {
		return nil, err
	}
	if len(lat) == 0 {
		return nil, errors.New("no PING answered")
	}
	slices.Sort(lat)
	return lat, nil
}

// pingFigures are the PING latency's p50, p99 and max under a load.
func pingFigures(under string, sorted []time.Duration) figures {
	return figures{
		{"PING p50, " + under, "ms", percentile(sorted, 50)},
		{"PING p99, " + under, "ms", percentile(sorted, 99)},
		{"PING max, " + under, "ms", percentile(sorted, 100)},
	}
}

// redisUse is how much Redis has worked since it started, on every master,
// in seconds: CPU (INFO cpu, user and system) and time in scripts (INFO
// commandstats, EVALSHA and FCALL).
type redisUse struct{ cpu, scripts float64 }

func (b *bench) redisTime(ctx context.Context) (redisUse, error) {
	var u redisUse
	for _, node := range b.nodes {
		info, err := node.Info(ctx, "cpu", "commandstats").Result()
		if err != nil {
			return redisUse{}, fmt.Errorf("info: %w", err)
		}
		user, sys := usedCPU(info)
		u.cpu += user + sys
		u.scripts += float64(scriptStatUsec(info)) / 1e6
	}
	return u, nil
}
