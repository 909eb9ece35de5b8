package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/internal/tcpproxy"
)

// Scenario N (run only when named: -only n) measures delivery through a
// network that cuts connections: the producer and the consumer processes
// reach Redis through a relay (internal/tcpproxy) that closes every
// connection it relays once per -n-cut and goes on accepting new ones at
// once, or that has every connection go silent at once (-n-stall). The
// producer pushes -n-jobs jobs due at random over -n-spread; a consumer
// process per -n-methods item takes them (Consume with 16 handlers, or 16
// goroutines calling Pop and Finish); the consumers, the producer or all
// call Start (-n-start), so the bucket handler runs behind the relay too.
// The parent reads the topic's counts every 100 ms past the relay, straight
// from Redis: the ready backlog and the age of its oldest job. Children
// retry what fails and count it (-endure), so a run ends only with every job
// delivered or the wait after the last due time over.
const cutScenarioID = "n"

// cutParams shape scenario N.
type cutParams struct {
	jobs        int
	spread      time.Duration
	every       time.Duration // between cuts; 0: none
	down        time.Duration // how long the relay stays down at each cut, refusing to relay
	stall       time.Duration // from the first due time to the silent stall; 0: none
	delay       time.Duration // added by the relay each way
	margin      time.Duration // from "go" to the first due time: pushing goes through cuts too
	starters    string        // which processes call Start: consumers, producer or all
	readTimeout time.Duration // the children's client ReadTimeout; 0: go-redis's default
	methods     []string
	timeline    string // folder for each run's timeline; empty: none
	logLevel    string // the children's queue log level; empty: their default
}

// cutWait is how long a run waits for deliveries after the last due time.
const cutWait = 30 * time.Second

// cutFigs are scenario N's figures, in table order.
var cutFigs = []figureDef{
	{name: "lateness p50", unit: "ms"},
	{name: "lateness p99", unit: "ms"},
	{name: "lateness max", unit: "ms"},
	{name: "ready backlog max", unit: "jobs"},
	{name: "ready backlog mean", unit: "jobs"},
	{name: "oldest ready max", unit: "ms"},
	{name: "missing", unit: "jobs"},
	{name: "duplicated", unit: "jobs"},
	{name: "cuts"},
	{name: "errors retried"},
	{name: "pushing ended, from first due", unit: "ms"},
	{name: "parent's longest timer delay", unit: "ms"},
}

// cutSample is one look at the topic's counts.
type cutSample struct {
	at     time.Time
	ready  int
	oldest time.Duration
	cuts   int64
}

// runCuts runs scenario N runs times and prints every run and the medians.
func (b *bench) runCuts(ctx context.Context, p cutParams, runs int) error {
	if b.cluster {
		return errors.New("-only n: a single server only (one relay)")
	}
	var all [][]float64
	for i := range runs {
		figs, err := b.runCut(ctx, p, i)
		if err != nil {
			return fmt.Errorf("n run %d: %w", i+1, err)
		}
		all = append(all, figs)
		var parts []string
		for k, fd := range cutFigs {
			parts = append(parts, fd.name+" "+cell(figs[k]))
		}
		fmt.Fprintf(os.Stderr, "dqbench: n run %d of %d: %s\n", i+1, runs, strings.Join(parts, "; "))
	}
	what := fmt.Sprintf("a cut every %v", p.every)
	if p.down > 0 {
		what += fmt.Sprintf(" (down %v each time)", p.down)
	}
	if p.every <= 0 {
		what = "no cuts"
	}
	if p.stall > 0 {
		what += fmt.Sprintf(", every connection stalled %v after the first due time", p.stall)
	}
	if p.delay > 0 {
		what += fmt.Sprintf(", %v added each way", p.delay)
	}
	if p.readTimeout != 0 {
		what += fmt.Sprintf(", clients' ReadTimeout %v", p.readTimeout)
	}
	fmt.Printf("N network cuts: %d jobs due over %v, consumers %s, Start called by %s, %s.\n\n",
		p.jobs, p.spread, strings.Join(p.methods, " and "), p.starters, what)
	head, rule := "| run |", "|---|"
	for _, fd := range cutFigs {
		head += " " + fd.name
		if fd.unit != "" {
			head += ", " + fd.unit
		}
		head += " |"
		rule += "---|"
	}
	fmt.Println(head)
	fmt.Println(rule)
	for i, figs := range all {
		row := fmt.Sprintf("| %d |", i+1)
		for _, v := range figs {
			row += " " + cell(v) + " |"
		}
		fmt.Println(row)
	}
	row := "| median |"
	for k := range cutFigs {
		vals := make([]float64, len(all))
		for i := range all {
			vals[i] = all[i][k]
		}
		slices.Sort(vals)
		row += " " + cell(median(vals)) + " |"
	}
	fmt.Println(row)
	return nil
}

// runCut runs scenario N once, with its processes started afresh on an
// empty Redis behind a relay of its own.
func (b *bench) runCut(ctx context.Context, p cutParams, run int) ([]float64, error) {
	if err := b.reset(ctx); err != nil {
		return nil, err
	}
	proxy, err := tcpproxy.Start(b.addrs[0], true)
	if err != nil {
		return nil, err
	}
	defer proxy.Close()
	proxy.SetDelay(p.delay)
	got := newReceipts(p.jobs)
	f := newFleet(got)
	defer f.kill()
	name := b.queueName(cutScenarioID)
	args := []string{
		"-addrs", proxy.Addr, "-queue", name, "-impl", "dq", "-endure",
		"-jobs", strconv.Itoa(p.jobs), "-due", string(dueAt), "-spread", p.spread.String(),
		"-timeout", (p.margin + p.spread + cutWait + time.Minute).String(),
	}
	if p.logLevel != "" {
		args = append(args, "-log", p.logLevel)
	}
	if p.readTimeout != 0 {
		args = append(args, "-read-timeout", p.readTimeout.String())
	}
	for _, m := range p.methods {
		start := "-start=" + strconv.FormatBool(p.starters != "producer")
		if _, err := f.start("consumer "+m, "consumer", append(args, "-method", m, start)...); err != nil {
			return nil, err
		}
	}
	pusher, err := f.start("producer", "producer", append(args, "-start="+strconv.FormatBool(p.starters != "consumers"))...)
	if err != nil {
		return nil, err
	}
	if err := f.waitReady(ctx, 30*time.Second); err != nil {
		return nil, err
	}
	// The parent looks straight at Redis, not through the relay.
	look, err := delayqueue.New(b.client, delayqueue.WithName(name), delayqueue.WithoutInstance())
	if err != nil {
		return nil, err
	}
	defer func() { _ = look.Close(context.WithoutCancel(ctx)) }()

	goAt := time.Now()
	base := goAt.Add(p.margin)
	if _, err := fmt.Fprintf(pusher.stdin, "%s%d\n", goPrefix, base.UnixMilli()); err != nil {
		return nil, fmt.Errorf("%s: %w", pusher.name, err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var cuts atomic.Int64
	var cutTimes []time.Time // written by the cutter until wg is done
	wg.Add(2)
	go func() {
		defer wg.Done()
		var tick <-chan time.Time
		if p.every > 0 {
			t := time.NewTicker(p.every)
			defer t.Stop()
			tick = t.C
		}
		var stall <-chan time.Time
		if p.stall > 0 {
			t := time.NewTimer(time.Until(base.Add(p.stall)))
			defer t.Stop()
			stall = t.C
		}
		for {
			select {
			case <-stop:
				return
			case <-tick:
				proxy.SetUp(false)
				if p.down > 0 {
					time.Sleep(p.down)
				}
				proxy.SetUp(true)
				cutTimes = append(cutTimes, time.Now())
				cuts.Add(1)
			case <-stall:
				proxy.Stall()
				cutTimes = append(cutTimes, time.Now())
				fmt.Fprintf(os.Stderr, "dqbench: n: every connection stalled at %d µs\n", time.Now().UnixMicro())
			}
		}
	}()
	// How late the parent's own timer fires: a machine too busy to run
	// its processes for a while makes every figure of the run worse, not
	// only the relay's cuts.
	var delayed time.Duration // written by the watcher until wg is done
	wg.Add(1)
	go func() {
		defer wg.Done()
		const every = 10 * time.Millisecond
		t := time.NewTicker(every)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				now := time.Now()
				delayed = max(delayed, now.Sub(last)-every)
				last = now
			}
		}
	}()
	var samples []cutSample // written by the sampler until wg is done
	go func() {
		defer wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				c, err := look.Counts(ctx, layoutTopic)
				if err != nil {
					continue
				}
				samples = append(samples, cutSample{at: time.Now(), ready: c.Ready, oldest: c.OldestReady, cuts: cuts.Load()})
			}
		}
	}()
	deadline := time.NewTimer(time.Until(base.Add(p.spread + cutWait)))
	defer deadline.Stop()
	err = func() error {
		for {
			select {
			case <-got.all:
				return nil
			case q := <-f.exited:
				if q.err != nil {
					return q.err
				}
				if q != pusher {
					return fmt.Errorf("%s exited before it was stopped", q.name)
				}
			case <-deadline.C:
				return nil // the jobs not delivered by now are missing
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}()
	close(stop)
	wg.Wait()
	if err != nil {
		return nil, err
	}
	if err := f.stop(ctx, 30*time.Second); err != nil {
		return nil, err
	}
	retried := 0
	for _, q := range f.procs {
		retried += q.result.Retried
	}
	got.mu.Lock()
	defer got.mu.Unlock()
	// A job never delivered: where is it? Reserved, say, by a reserve
	// call whose reply no consumer got.
	for i, n := range got.seen {
		if n == 0 {
			state := "gone"
			if job, err := look.Get(ctx, "j"+strconv.Itoa(i)); err == nil {
				state = fmt.Sprintf("%v, %d attempts, reserved until %s", job.State, job.Attempts, job.ReservedUntil.Format(time.TimeOnly))
			}
			fmt.Fprintf(os.Stderr, "dqbench: n run %d: job j%d not delivered at the end of the run (%s): %s\n",
				run+1, i, time.Now().Format(time.TimeOnly), state)
		}
	}
	lates := slices.Clone(got.lates)
	slices.Sort(lates)
	maxReady, sumReady, n := 0, 0, 0
	var oldest time.Duration
	for _, s := range samples {
		maxReady = max(maxReady, s.ready)
		oldest = max(oldest, s.oldest)
		if !s.at.Before(base) && !s.at.After(base.Add(p.spread)) {
			sumReady += s.ready
			n++
		}
	}
	meanReady := 0.0
	if n > 0 {
		meanReady = float64(sumReady) / float64(n)
	}
	if p.timeline != "" {
		if err := writeCutTimeline(filepath.Join(p.timeline, fmt.Sprintf("n-run%d.csv", run+1)), base, samples, cutTimes, got.firsts); err != nil {
			return nil, err
		}
	}
	return []float64{
		percentile(lates, 50), percentile(lates, 99), percentile(lates, 100),
		float64(maxReady), meanReady, float64(oldest.Microseconds()) / 1000,
		float64(p.jobs - got.distinct), float64(got.total - got.distinct),
		float64(cuts.Load()), float64(retried),
		float64(time.UnixMicro(pusher.result.PushEnd).Sub(base).Microseconds()) / 1000,
		float64(delayed.Microseconds()) / 1000,
	}, nil
}

// writeCutTimeline writes a run's timeline as CSV: per 100 ms sample, its
// time from the first due time, the ready backlog, the oldest ready job's
// age, the cuts so far, and the first deliveries since the sample before
// with the largest lateness among them. Comment lines give the first due
// time and every cut (or stall) in Unix µs, to set beside the children's
// logs.
func writeCutTimeline(path string, base time.Time, samples []cutSample, cuts []time.Time, firsts []receipt) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	file, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(file)
	fmt.Fprintf(w, "# base_us %d\n", base.UnixMicro())
	for _, c := range cuts {
		fmt.Fprintf(w, "# cut_us %d\n", c.UnixMicro())
	}
	fmt.Fprintln(w, "t_ms,ready,oldest_ms,cuts,delivered,late_max_ms")
	byTime := slices.Clone(firsts)
	slices.SortFunc(byTime, func(a, b receipt) int { return a.at.Compare(b.at) })
	i := 0
	for _, s := range samples {
		delivered := 0
		var late time.Duration
		for ; i < len(byTime) && !byTime[i].at.After(s.at); i++ {
			delivered++
			late = max(late, byTime[i].at.Sub(byTime[i].due))
		}
		fmt.Fprintf(w, "%d,%d,%d,%d,%d,%d\n", s.at.Sub(base).Milliseconds(), s.ready, s.oldest.Milliseconds(),
			s.cuts, delivered, late.Milliseconds())
	}
	if err := w.Flush(); err != nil {
		_ = file.Close()
		return err
	}
	return file.Close()
}
