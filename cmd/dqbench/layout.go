package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The layout scenarios measure the queue as users run it, in processes of
// their own (see protocol.go), against the minimal design (minimal.go) in
// the same layout: each run measures both, back to back, the first of the
// two alternating from run to run.

// layoutScenario is one such measurement.
type layoutScenario struct {
	id, title string
	figs      []figureDef
	// consumers is false for a producer process alone: no topology and no
	// consumer method.
	consumers bool
	params    func(b *bench) layoutParams
	figures   func(o *outcome) ([]float64, error)
	// takeover: the first consumer process, which takes every bucket's
	// lease, is killed (or frozen) mid-run; the queue alone is measured,
	// as the baseline's one mover has no stand-in.
	takeover bool
	// churn: consumer processes are killed two at a time and replaced
	// while the jobs fall due (churn.go); the queue alone is measured.
	churn bool
}

// dqOnly reports whether the scenario measures the queue alone.
func (s *layoutScenario) dqOnly() bool { return s.takeover || s.churn }

// figureDef describes one figure of a layout scenario.
type figureDef struct {
	name, unit   string
	higherBetter bool // throughput: the worst run is the lowest
	dqOnly       bool // the baseline has no such figure
}

// layoutParams are a scenario's jobs and how long a run may take.
type layoutParams struct {
	jobs   int
	due    dueKind
	margin time.Duration // from "go" to the first due time
	spread time.Duration // jobs are due at random over this long
	wait   time.Duration // for the last job, from the last due time
	// killAfter: when, after the first due time, the takeover scenario
	// kills the lease holder.
	killAfter time.Duration
}

// outcome is what one run of a layout saw.
type outcome struct {
	impl  string
	jobs  int
	base  time.Time     // the first due time
	push  childResult   // the pushing process's result
	all   []childResult // every process's
	got   *receipts
	calls commandCount // from "go" to the last delivery, or the end of pushing
	// killed is when the takeover scenario killed the lease holder.
	killed time.Time
	// kills is how many processes the churn scenario killed.
	kills int
}

// designs are the two designs measured, in table order.
var designs = []string{"dq", "min"}

var layoutScenarios = []*layoutScenario{
	{
		id: "l", title: "lateness", consumers: true,
		figs: []figureDef{
			{name: "lateness p50", unit: "ms"},
			{name: "lateness p99", unit: "ms"},
			{name: "lateness max", unit: "ms"},
			{name: "early, server clock", unit: "jobs", dqOnly: true},
			{name: "missing", unit: "jobs"},
			{name: "duplicated", unit: "jobs"},
			{name: "pushing done before first due", unit: "ms", higherBetter: true},
			{name: "Redis CPU per job, pushed and delivered", unit: "µs"},
			{name: "of it, in the kernel", unit: "µs"},
			{name: "blocked pops per job"},
			{name: "reserve calls per job", dqOnly: true},
		},
		params: func(b *bench) layoutParams {
			return layoutParams{jobs: b.lJobs, due: dueAt, margin: 3 * time.Second, spread: b.lSpread, wait: 10 * time.Second}
		},
		figures: latenessFigures,
	},
	{
		id: "k", title: "lease holder killed", consumers: true, takeover: true,
		figs: []figureDef{
			{name: "lateness p50, due in the 5 s after the kill", unit: "ms", dqOnly: true},
			{name: "lateness p99, due in the 5 s after the kill", unit: "ms", dqOnly: true},
			{name: "lateness max, due in the 5 s after the kill", unit: "ms", dqOnly: true},
			{name: "lateness p99, due before the kill", unit: "ms", dqOnly: true},
			{name: "missing", unit: "jobs", dqOnly: true},
			{name: "delivered again (held by the killed process)", unit: "jobs", dqOnly: true},
		},
		params: func(b *bench) layoutParams {
			return layoutParams{jobs: 6000, due: dueAt, margin: 3 * time.Second, spread: 10 * time.Second,
				wait: takeoverTTR + 5*time.Second, killAfter: 3 * time.Second}
		},
		figures: takeoverFigures,
	},
	{
		id: "c", title: "workers killed two at a time", consumers: true, churn: true,
		figs: []figureDef{
			{name: "lateness p50, first attempt", unit: "ms", dqOnly: true},
			{name: "lateness p99, first attempt", unit: "ms", dqOnly: true},
			{name: "lateness max, first attempt", unit: "ms", dqOnly: true},
			{name: "delivered first after a TTR (held by a killed process)", unit: "jobs", dqOnly: true},
			{name: "early, server clock", unit: "jobs", dqOnly: true},
			{name: "missing", unit: "jobs", dqOnly: true},
			{name: "delivered again", unit: "jobs", dqOnly: true},
			{name: "processes killed", dqOnly: true},
		},
		params: func(b *bench) layoutParams {
			return layoutParams{jobs: 15_000, due: dueAt, margin: 3 * time.Second, spread: b.cSpread,
				wait: takeoverTTR + 10*time.Second, killAfter: time.Second}
		},
		figures: churnFigures,
	},
	{
		id: "e", title: "end to end, due now", consumers: true,
		figs:   throughputFigs,
		params: func(*bench) layoutParams { return layoutParams{jobs: 50_000, due: dueNow, wait: 2 * time.Minute} },
		figures: func(o *outcome) ([]float64, error) {
			if o.got.distinct < o.jobs {
				return nil, fmt.Errorf("delivered %d of %d jobs", o.got.distinct, o.jobs)
			}
			return o.throughput(o.got.last), nil
		},
	},
	{
		id: "p", title: "push, producer process",
		figs:   throughputFigs,
		params: func(*bench) layoutParams { return layoutParams{jobs: 100_000, due: dueHour, wait: 2 * time.Minute} },
		figures: func(o *outcome) ([]float64, error) {
			if o.push.Pushed < o.jobs {
				return nil, fmt.Errorf("pushed %d of %d jobs", o.push.Pushed, o.jobs)
			}
			return o.throughput(time.UnixMicro(o.push.PushEnd)), nil
		},
	},
}

var throughputFigs = []figureDef{
	{name: "throughput", unit: "jobs/s", higherBetter: true},
	{name: "commands sent per job"},
	{name: "commands run per job, incl. inside scripts"},
	{name: "Redis CPU per job", unit: "µs"},
	{name: "of it, in the kernel", unit: "µs"},
	{name: "Redis time in scripts per job", unit: "µs"},
	{name: "blocked pops per job"},
	{name: "reserve calls that found no job", unit: "%", dqOnly: true},
	{name: "of all reserve calls, claims and lost-signal looks that found another process there first", unit: "%", dqOnly: true},
	{name: "reserve calls that found no job and carried no finish", unit: "%", dqOnly: true},
	{name: "reserve calls per job", dqOnly: true},
}

// throughput is the jobs per second from the start of pushing to end, and
// the commands, the Redis CPU time and the time in scripts per job, and
// the reserve calls.
func (o *outcome) throughput(end time.Time) []float64 {
	took := end.Sub(time.UnixMicro(o.push.PushStart))
	n := float64(o.jobs)
	empty, unclaimed, alone, perJob := o.reserveCalls()
	return []float64{n / took.Seconds(), float64(o.calls.sent) / n, float64(o.calls.run) / n, o.calls.cpu / n * 1e6,
		o.calls.sys / n * 1e6, float64(o.calls.scripts) / n, float64(o.calls.blocked) / n, empty, unclaimed, alone, perJob}
}

// reserveCalls is, for the queue, the share of its processes' reserve
// calls that found no job, that came only to claim signals and found them
// taken, and that found no job and carried no finish (%), and the reserve
// calls per job; NaN for the baseline.
func (o *outcome) reserveCalls() (empty, unclaimed, alone, perJob float64) {
	empty, unclaimed, alone, perJob = math.NaN(), math.NaN(), math.NaN(), math.NaN()
	if o.impl != "dq" {
		return
	}
	var all, none, lost, idle int
	for _, r := range o.all {
		all, none, lost, idle = all+r.Reserves, none+r.Empty, lost+r.Unclaimed, idle+r.Alone
	}
	if all > 0 {
		empty = 100 * float64(none) / float64(all)
		unclaimed = 100 * float64(lost) / float64(all)
		alone = 100 * float64(idle) / float64(all)
	}
	return empty, unclaimed, alone, float64(all) / float64(o.jobs)
}

func latenessFigures(o *outcome) ([]float64, error) {
	g := o.got
	slices.Sort(g.lates)
	early := math.NaN()
	if o.impl == "dq" {
		early = float64(g.early)
	}
	margin := o.base.Sub(time.UnixMicro(o.push.PushEnd))
	if margin <= 0 {
		fmt.Fprintf(os.Stderr, "dqbench: l, %s: pushing ended %v after the first due time\n", o.impl, -margin)
	}
	n := float64(o.jobs)
	_, _, _, reserves := o.reserveCalls()
	return []float64{
		percentile(g.lates, 50), percentile(g.lates, 99), percentile(g.lates, 100),
		early,
		float64(o.jobs - g.distinct),
		float64(g.total - g.distinct),
		float64(margin.Microseconds()) / 1000,
		o.calls.cpu / n * 1e6, o.calls.sys / n * 1e6, float64(o.calls.blocked) / n, reserves,
	}, nil
}

// runLayout runs scenario s once for one design (impl) in a topology: its
// processes, started afresh on an empty Redis.
func (b *bench) runLayout(ctx context.Context, s *layoutScenario, topology, method, impl string) ([]float64, error) {
	if err := b.reset(ctx); err != nil {
		return nil, err
	}
	prm := s.params(b)
	if s.takeover && (topology != "multi" || b.consumers < 2) {
		return nil, fmt.Errorf("%s: needs -topology multi and -consumers 2 or more", s.id)
	}
	if s.churn && (topology != "multi" || b.consumers < 3) {
		return nil, fmt.Errorf("%s: needs -topology multi and -consumers 3 or more", s.id)
	}
	got := newReceipts(prm.jobs)
	f := newFleet(got)
	defer f.kill()
	args := []string{
		"-addrs", strings.Join(b.addrs, ","), "-queue", b.queueName(s.id),
		"-impl", impl, "-jobs", strconv.Itoa(prm.jobs), "-producers", strconv.Itoa(b.producers),
		"-due", string(prm.due), "-spread", prm.spread.String(),
		"-timeout", (prm.margin + prm.spread + prm.wait + time.Minute).String(),
		"-cluster=" + strconv.FormatBool(b.cluster),
	}
	if method != "" {
		args = append(args, "-method", method)
	}
	if impl == "dq" {
		args = append(args, "-observe", b.observe)
		if b.callerIDs {
			args = append(args, "-caller-ids")
		}
		if s.dqOnly() {
			args = append(args, "-ttr", takeoverTTR.String())
		}
	}
	if s.dqOnly() {
		args = append(args, "-flush-each") // the killed processes' receipts too
	}
	var pusher *proc
	var err error
	consumerArgs := append(slices.Clip(args), "-start=true")
	switch {
	case !s.consumers:
		pusher, err = f.start("producer", "producer", args...)
	case topology == "single":
		pusher, err = f.start("single process", "single", append(args, "-start")...)
	default:
		consumers := 1
		if topology == "multi" {
			consumers = b.consumers
		}
		for i := range consumers {
			// Every process of the queue starts; one moves the baseline's jobs.
			start := impl == "dq" || i == 0
			if _, err = f.start(fmt.Sprintf("consumer %d", i+1), "consumer", append(args, "-start="+strconv.FormatBool(start))...); err != nil {
				break
			}
		}
		if err == nil {
			pusher, err = f.start("producer", "producer", args...)
		}
	}
	if err != nil {
		return nil, err
	}
	if err := f.waitReady(ctx, 30*time.Second); err != nil {
		return nil, err
	}

	before, err := b.commandCallsOf(ctx, impl)
	if err != nil {
		return nil, err
	}
	goAt := time.Now()
	base := goAt.Add(prm.margin)
	if _, err := fmt.Fprintf(pusher.stdin, "%s%d\n", goPrefix, base.UnixMilli()); err != nil {
		return nil, fmt.Errorf("%s: %w", pusher.name, err)
	}
	deadline := time.NewTimer(time.Until(base.Add(prm.spread + prm.wait)))
	defer deadline.Stop()
	var all <-chan struct{}
	if s.consumers {
		all = got.all
	}
	// The first consumer started first and holds every bucket's lease.
	var victim *proc
	var killed time.Time
	var killAt <-chan time.Time
	if s.takeover {
		t := time.NewTimer(time.Until(base.Add(prm.killAfter)))
		defer t.Stop()
		killAt = t.C
	}
	signal := func(p *proc) error { return p.cmd.Process.Signal(b.killSignal) }
	var churn *churner
	var strike <-chan time.Time
	var restart <-chan string
	if s.churn {
		churn = newChurner(f, consumerArgs, signal, base.Add(prm.killAfter), base.Add(prm.spread-5*time.Second))
		defer churn.stop()
		strike, restart = churn.next.C, churn.restarts
	}
wait:
	for {
		select {
		case <-killAt:
			victim, killed = f.procs[0], time.Now()
			if err := signal(victim); err != nil {
				return nil, fmt.Errorf("signal %s: %w", victim.name, err)
			}
		case <-strike:
			if err := churn.strike(); err != nil {
				return nil, err
			}
		case name := <-restart:
			if err := churn.restart(name); err != nil {
				return nil, err
			}
		case <-all:
			break wait
		case p := <-f.exited:
			switch {
			case p == victim || churn != nil && churn.victims[p]:
				continue // its end is the scenario's
			case p.err != nil:
				return nil, p.err
			case p != pusher:
				return nil, fmt.Errorf("%s exited before it was stopped", p.name)
			case !s.consumers:
				break wait
			}
		case <-deadline.C:
			break wait // the jobs not delivered by now are missing
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	after, err := b.commandCallsOf(ctx, impl)
	if err != nil {
		return nil, err
	}
	if victim != nil {
		// A frozen process is killed too; either way it leaves the fleet.
		_ = victim.cmd.Process.Kill()
		<-victim.done
		f.procs = slices.DeleteFunc(f.procs, func(p *proc) bool { return p == victim })
	}
	kills := 0
	if churn != nil {
		churn.stop()
		kills = len(churn.victims)
		// A process started late stops only once it has started.
		if err := f.waitReady(ctx, 30*time.Second); err != nil {
			return nil, err
		}
	}
	if err := f.stop(ctx, 30*time.Second); err != nil {
		return nil, err
	}
	var results []childResult
	for _, p := range f.procs {
		results = append(results, p.result)
	}
	return s.figures(&outcome{impl: impl, jobs: prm.jobs, base: base, push: pusher.result, all: results, got: got, calls: after.sub(before), killed: killed, kills: kills})
}

// layoutRuns is every run of one scenario in one topology with one
// consumer method.
type layoutRuns struct {
	s                *layoutScenario
	topology, method string
	runs             []pairRun
}

// name names run i for messages.
func (lr *layoutRuns) name(i int) string {
	return fmt.Sprintf("%s %s %s run %d", lr.s.id, lr.topology, dash(lr.method), i+1)
}

// dash is s, or a dash for none.
func dash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

// pairRun is one run of both designs.
type pairRun struct {
	dqFirst bool
	figs    [2][]float64 // by design, as in designs
	steal   [2]float64   // % of CPU time stolen during each
}

// runLayouts runs the chosen layout scenarios, runs times each, in every
// topology and consumer method, and prints their tables.
func (b *bench) runLayouts(ctx context.Context, chosen []*layoutScenario, runs int, topologies, methods []string) error {
	var all []*layoutRuns
	for _, s := range chosen {
		type combo struct{ topology, method string }
		combos := []combo{{"producer only", ""}}
		if s.consumers {
			combos = nil
			ts := topologies
			if s.dqOnly() {
				ts = []string{"multi"} // a process killed among several
			}
			for _, t := range ts {
				for _, m := range methods {
					combos = append(combos, combo{t, m})
				}
			}
		}
		for _, c := range combos {
			lr := &layoutRuns{s: s, topology: c.topology, method: c.method}
			for i := range runs {
				pr := pairRun{dqFirst: i%2 == 0}
				order := []int{0, 1}
				if !pr.dqFirst {
					order = []int{1, 0}
				}
				for _, k := range order {
					if s.dqOnly() && designs[k] != "dq" {
						pr.figs[k] = nanFigures(len(s.figs))
						continue
					}
					before := readCPU()
					figs, err := b.runLayout(ctx, s, c.topology, c.method, designs[k])
					if err != nil {
						return fmt.Errorf("%s, %s: %w", lr.name(i), designs[k], err)
					}
					pr.figs[k], pr.steal[k] = figs, stealPercent(before, readCPU())
				}
				lr.runs = append(lr.runs, pr)
				fmt.Fprintf(os.Stderr, "dqbench: %s of %d (dq / min): %s\n", lr.name(i), runs, pr.summary(s))
			}
			all = append(all, lr)
		}
	}
	printLayoutSummary(all)
	printLayoutRuns(all)
	return nil
}

// summary is a run's figures for both designs, for progress lines.
func (pr pairRun) summary(s *layoutScenario) string {
	var parts []string
	for i, fd := range s.figs {
		parts = append(parts, fmt.Sprintf("%s %s / %s", fd.name, cell(pr.figs[0][i]), cell(pr.figs[1][i])))
	}
	parts = append(parts, fmt.Sprintf("CPU steal %s / %s %%", cell(pr.steal[0]), cell(pr.steal[1])))
	return strings.Join(parts, "; ")
}

// printLayoutSummary prints, per figure, each design's median and worst run
// and their ratios.
func printLayoutSummary(all []*layoutRuns) {
	fmt.Println("Layouts: dq is the queue, min the minimal design (a ZADD per push, one mover script call per 100 due")
	fmt.Println("jobs, BLPOP without acknowledgement), measured back to back in each run. A design's worst run is its")
	fmt.Println("highest (its lowest for throughput and for the time pushing ended before the first due time).")
	fmt.Println()
	fmt.Println("| scenario | topology | method | figure | dq median | dq worst | min median | min worst | dq/min, medians | dq/min, median of runs |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	for _, lr := range all {
		for i, fd := range lr.s.figs {
			var vals [2][]float64
			var ratios []float64
			for _, r := range lr.runs {
				for k := range designs {
					vals[k] = append(vals[k], r.figs[k][i])
				}
				if q := r.figs[0][i] / r.figs[1][i]; !math.IsNaN(q) && !math.IsInf(q, 0) {
					ratios = append(ratios, q)
				}
			}
			var med, worst [2]float64
			for k := range designs {
				slices.Sort(vals[k])
				med[k] = median(vals[k])
				worst[k] = vals[k][len(vals[k])-1]
				if fd.higherBetter {
					worst[k] = vals[k][0]
				}
			}
			ratio, runRatio := "–", "–"
			if q := med[0] / med[1]; !math.IsNaN(q) && !math.IsInf(q, 0) {
				ratio = fmt.Sprintf("%.2f", q)
			}
			if len(ratios) > 0 {
				slices.Sort(ratios)
				runRatio = fmt.Sprintf("%.2f", median(ratios))
			}
			unit := ""
			if fd.unit != "" {
				unit = " " + fd.unit
			}
			fmt.Printf("| %s %s | %s | %s | %s | %s%s | %s | %s | %s | %s | %s |\n",
				strings.ToUpper(lr.s.id), lr.s.title, lr.topology, dash(lr.method), fd.name,
				cell(med[0]), unit, cell(worst[0]), cell(med[1]), cell(worst[1]), ratio, runRatio)
		}
	}
}

// printLayoutRuns prints every run's figures, one table per scenario, with
// the CPU steal during each design's half.
func printLayoutRuns(all []*layoutRuns) {
	var last *layoutScenario
	for _, lr := range all {
		if lr.s != last {
			last = lr.s
			fmt.Printf("\nRuns of %s %s (dq / min; \"first\" ran first):\n\n", strings.ToUpper(lr.s.id), lr.s.title)
			head := "| topology | method | run | first |"
			rule := "|---|---|---|---|"
			for _, fd := range lr.s.figs {
				head += " " + fd.name
				if fd.unit != "" {
					head += ", " + fd.unit
				}
				head += " |"
				rule += "---|"
			}
			fmt.Println(head + " CPU steal, % |")
			fmt.Println(rule + "---|")
		}
		for i, r := range lr.runs {
			first := designs[1]
			if r.dqFirst {
				first = designs[0]
			}
			row := fmt.Sprintf("| %s | %s | %d | %s |", lr.topology, dash(lr.method), i+1, first)
			for k := range lr.s.figs {
				row += fmt.Sprintf(" %s / %s |", cell(r.figs[0][k]), cell(r.figs[1][k]))
			}
			fmt.Println(row + fmt.Sprintf(" %s / %s |", cell(r.steal[0]), cell(r.steal[1])))
		}
	}
}

// cell formats a figure, or a dash for one that does not apply.
func cell(v float64) string {
	switch {
	case math.IsNaN(v):
		return "–"
	case v < 0:
		return "-" + num(-v)
	case v == math.Trunc(v) && v < 1000:
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return num(v)
}

// takeoverTTR is the jobs' TTR in the takeover scenario: the jobs that the
// killed process held come back after it, within the run.
const takeoverTTR = 5 * time.Second

// takeoverFigures are the lateness of the jobs due in the 5 s after the
// kill, which only a process that took over the killed one's buckets can
// move, beside that of the jobs due before it.
func takeoverFigures(o *outcome) ([]float64, error) {
	if o.killed.IsZero() {
		return nil, errors.New("the run ended before the lease holder was killed")
	}
	var after, before []time.Duration
	for _, r := range o.got.firsts {
		switch {
		case r.due.Before(o.killed):
			before = append(before, r.at.Sub(r.due))
		case r.due.Before(o.killed.Add(5 * time.Second)):
			after = append(after, r.at.Sub(r.due))
		}
	}
	if len(after) == 0 {
		return nil, errors.New("no job due in the 5 s after the kill was delivered")
	}
	slices.Sort(after)
	slices.Sort(before)
	return []float64{percentile(after, 50), percentile(after, 99), percentile(after, 100),
		percentile(before, 99), float64(o.jobs - o.got.distinct), float64(o.got.total - o.got.distinct)}, nil
}

// nanFigures is n figures that a design does not have.
func nanFigures(n int) []float64 {
	figs := make([]float64, n)
	for i := range figs {
		figs[i] = math.NaN()
	}
	return figs
}
