package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dqueue/delayqueue"
)

// backlogJobs is how many jobs S7 makes due at the same moment.
var backlogJobs = 1_000_000

// backlog (S7) makes backlogJobs jobs due at the same moment and times
// their drain to the ready lists, and every script call of it: SLOWLOG,
// with its threshold at 0 while the drain runs, keeps each call's time.
// SLOWLOG times a call on the wall clock, so a Redis that loses its core
// mid-call is charged for the wait; the figures show what Redis's other
// clients see, the queue's work and the machine's noise together.
func backlog(ctx context.Context, b *bench) (figures, error) {
	n := backlogJobs
	// The moves are counted as they are reported, so that waiting for
	// the drain sends Redis nothing.
	var moved atomic.Int64
	drainedAt := make(chan time.Time, 1)
	q, err := b.open("s7", delayqueue.WithObserver(delayqueue.ObserverFunc(func(_ context.Context, e delayqueue.Event) {
		if e.Kind == delayqueue.EventMoved && moved.Add(int64(e.Count)) == int64(n) {
			drainedAt <- time.Now()
		}
	})))
	if err != nil {
		return nil, err
	}
	defer func() { _ = b.close(ctx, q) }()
	body := body()
	// Due once the pushes are done: PushMany runs at well over 50,000
	// jobs/s, and a second more keeps them apart from the drain.
	due := time.Now().Add(time.Duration(n/50_000+1) * time.Second)
	if err := pushMany(ctx, q, n, func() *delayqueue.Job {
		return &delayqueue.Job{Topic: "bench", Body: body, RunAt: due}
	}); err != nil {
		return nil, err
	}
	if time.Now().After(due) {
		return nil, fmt.Errorf("pushing %d jobs took past their due time", n)
	}
	restore, err := b.logEveryCommand(ctx, n)
	if err != nil {
		return nil, err
	}
	defer restore()
	if err := b.resetStats(ctx); err != nil {
		return nil, err
	}
	if err := q.Start(ctx); err != nil {
		return nil, err
	}
	var drained time.Duration
	select {
	case at := <-drainedAt:
		drained = at.Sub(due)
	case <-time.After(5 * time.Minute):
		return nil, fmt.Errorf("%d of %d jobs made ready within 5 minutes", moved.Load(), n)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	usec, err := b.scriptUsec(ctx)
	if err != nil {
		return nil, err
	}
	calls, err := b.scriptTimes(ctx)
	if err != nil {
		return nil, err
	}
	if len(calls) == 0 {
		return nil, fmt.Errorf("SLOWLOG kept no script call")
	}
	slices.Sort(calls)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return figures{
		{"drained after the due time", "s", drained.Seconds()},
		{"jobs made ready per second", "jobs/s", float64(n) / max(drained.Seconds(), 1e-3)},
		{"script calls", "calls", float64(len(calls))},
		{"Redis time per job", "µs", float64(usec) / float64(n)},
		{"script call, median", "ms", ms(calls[len(calls)/2])},
		{"script call, p99", "ms", ms(calls[len(calls)*99/100])},
		{"script call, longest", "ms", ms(calls[len(calls)-1])},
	}, nil
}

// logEveryCommand has every node's SLOWLOG keep every command, up to room
// for calls of them, starting empty; restore puts the settings back, and
// empties the log of what it kept, on every node it changed, however far
// it got.
func (b *bench) logEveryCommand(ctx context.Context, calls int) (restore func(), err error) {
	var undo []func()
	restore = func() {
		for _, f := range undo {
			f()
		}
	}
	for _, node := range b.nodes {
		old, err := node.ConfigGet(ctx, "slowlog-*").Result()
		if err != nil {
			restore()
			return nil, fmt.Errorf("config get slowlog-*: %w", err)
		}
		undo = append(undo, func() {
			bg := context.Background() // after Ctrl-C too
			for k, v := range old {
				_ = node.ConfigSet(bg, k, v).Err()
			}
			_ = node.SlowLogReset(bg).Err()
		})
		for k, v := range map[string]string{"slowlog-log-slower-than": "0", "slowlog-max-len": fmt.Sprint(calls)} {
			if err := node.ConfigSet(ctx, k, v).Err(); err != nil {
				restore()
				return nil, fmt.Errorf("config set %s: %w", k, err)
			}
		}
		if err := node.SlowLogReset(ctx).Err(); err != nil {
			restore()
			return nil, fmt.Errorf("slowlog reset: %w", err)
		}
	}
	return restore, nil
}

// isScriptCall reports whether a command runs a script: by SHA or code
// (EVAL, EVALSHA), or as a function (FCALL).
func isScriptCall(command string) bool {
	c := strings.ToLower(command)
	return strings.HasPrefix(c, "eval") || strings.HasPrefix(c, "fcall")
}

// scriptTimes returns the time of every script call in the nodes' SLOWLOGs.
func (b *bench) scriptTimes(ctx context.Context) ([]time.Duration, error) {
	var times []time.Duration
	for _, node := range b.nodes {
		entries, err := node.SlowLogGet(ctx, -1).Result()
		if err != nil {
			return nil, fmt.Errorf("slowlog get: %w", err)
		}
		for _, e := range entries {
			if len(e.Args) > 0 && isScriptCall(e.Args[0]) {
				times = append(times, e.Duration)
			}
		}
	}
	return times, nil
}
