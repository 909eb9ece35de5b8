// Command dqbench measures delayqueue on a real Redis and prints a Markdown
// table of medians over several runs, with min–max.
//
//	go run ./cmd/dqbench                  # starts a throwaway redis-server
//	go run ./cmd/dqbench -addr host:port  # an existing Redis (its data is flushed!)
//	go run ./cmd/dqbench -only s2 -runs 3
//	go run ./cmd/dqbench -cluster         # a throwaway 3-master Redis Cluster
//	go run ./cmd/dqbench -only s1,s3 -observe prom   # with dqprom attached and scraped every second
//	go run ./cmd/dqbench -only s8 -s8-topics 10000   # what the dashboard's overview costs Redis
//
// The layout scenarios l (lateness), e (end to end) and p (push) run only
// when named: they run the queue in separate producer and consumer
// processes, in the topologies -topology names, and the minimal design
// beside it run by run (see layout.go):
//
//	go run ./cmd/dqbench -only l,e,p -runs 10 -topology single,split,multi -method pop,consume
//	go run ./cmd/dqbench -only l -hog 0.175   # beside a process keeping 17.5 % of the CPU busy
//
// Scenarios k (the lease holder killed) and c (workers killed two at a
// time and replaced, as pods on a node are) run the queue alone, in the
// multi topology whatever -topology says:
//
//	go run ./cmd/dqbench -only k -method consume -runs 3
//	go run ./cmd/dqbench -only c -method consume -consumers 8 -cluster
//
// Scenario n runs only when named too: a producer and consumer processes
// reach Redis through a relay that cuts every connection once per -n-cut,
// or has them all go silent (-n-stall); see cuts.go:
//
//	go run ./cmd/dqbench -only n -runs 3                       # 3,000 jobs due over 50 s, a cut every second
//	go run ./cmd/dqbench -only n -n-spread 20s -n-jobs 1200    # a shorter run
//	go run ./cmd/dqbench -only n -n-cut 0 -n-stall 10s         # one silent stall, no cuts
//
// Scenario iw, named too, runs -consumers idle worker processes (started,
// a Consume waiting, no job) and counts what each costs Redis:
//
//	go run ./cmd/dqbench -only iw -consumers 10 -runs 2 -cluster
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/internal/svgchart"
	"github.com/redis/go-redis/v9"
)

func main() {
	if len(os.Args) > 2 && os.Args[1] == roleFlag && os.Args[2] == hogRole {
		if err := runHog(os.Args[3:]); err != nil {
			fmt.Fprintln(os.Stderr, "dqbench hog:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == roleFlag {
		if err := runChild(os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, "dqbench child:", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "dqbench:", err)
		os.Exit(1)
	}
}

// scenario is one measurement; run returns named figures for one run.
type scenario struct {
	id, title string
	run       func(ctx context.Context, b *bench) (figures, error)
}

type figures []figure

type figure struct {
	name, unit string
	value      float64
}

type bench struct {
	client redis.UniversalClient
	nodes  []*redis.Client // every master, for INFO and resets
	seq    int

	addrs     []string // Redis (every master on a Cluster), for child processes
	cluster   bool
	lJobs     int           // jobs in L
	lSpread   time.Duration // L's jobs are due over this long
	cSpread   time.Duration // C's jobs are due over this long
	consumers int           // consumer processes in the multi topology
	producers int           // goroutines of the producer process pushing the layout scenarios' jobs
	callerIDs bool          // -ids caller: L and E's jobs carry IDs of the producer's
	// killSignal is how the takeover scenario ends the lease holder.
	killSignal syscall.Signal

	observe string                            // -observe: what the queues under test have attached
	detach  map[*delayqueue.DelayQueue]func() // what open attached, by queue, until close

	lateness [][]time.Duration // S2's sorted lateness samples, per run
	growth   [][2][]float64    // S6's push and move costs, per run
}

// queueName gives every run a queue of its own.
func (b *bench) queueName(s string) string {
	b.seq++
	return fmt.Sprintf("bench-%s-%d", s, b.seq)
}

// reset empties Redis and its statistics between runs.
func (b *bench) reset(ctx context.Context) error {
	for _, n := range b.nodes {
		if err := n.FlushAll(ctx).Err(); err != nil {
			return fmt.Errorf("flushall: %w", err)
		}
	}
	return b.resetStats(ctx)
}

// resetStats zeroes INFO commandstats.
func (b *bench) resetStats(ctx context.Context) error {
	for _, n := range b.nodes {
		if err := n.ConfigResetStat(ctx).Err(); err != nil {
			return fmt.Errorf("config resetstat: %w", err)
		}
	}
	return nil
}

func run(ctx context.Context) error {
	addr := flag.String("addr", "", "Redis address; empty starts a throwaway redis-server (the benchmark flushes the server's data)")
	runs := flag.Int("runs", 5, "runs per scenario; figures are medians with min–max")
	only := flag.String("only", "", "comma-separated scenario IDs to run (default: s1 to s8; the layout scenarios l, k, c, e and p, and n, lim and iw, run only when named)")
	cluster := flag.Bool("cluster", false, "run on a throwaway 3-master Redis Cluster")
	plots := flag.String("plots", "docs", "folder for the SVG charts of S2 and S6 (empty: none)")
	flag.IntVar(&latenessJobs, "s2-jobs", latenessJobs, "jobs in S2")
	flag.IntVar(&backlogJobs, "s7-jobs", backlogJobs, "jobs due at once in S7")
	flag.IntVar(&overviewTopics, "s8-topics", overviewTopics, "topics in S8")
	flag.DurationVar(&overviewLoad, "s8-load", overviewLoad, "how long each of S8's loads runs")
	topology := flag.String("topology", "single,split,multi", "layouts of L and E: single (one process pushes and consumes), split (a producer and a consumer process), multi (a producer and three consumers)")
	method := flag.String("method", "pop,consume", "how L and E's queue consumers take jobs: pop (16 goroutines calling Pop and Finish) or consume (Consume with 16 handlers)")
	b := &bench{}
	flag.IntVar(&b.lJobs, "l-jobs", 20_000, "jobs in L")
	flag.IntVar(&b.consumers, "consumers", 3, "consumer processes in the multi topology")
	flag.IntVar(&b.producers, "producers", producers, "goroutines of the producer process that push the layout scenarios' jobs, each one job at a time (the queue's pushes group those that wait into one call)")
	ids := flag.String("ids", "generated", "IDs of L and E's jobs: generated (by the queue) or caller (the producer's own, j<n>)")
	killWith := flag.String("k-signal", "kill", "how K ends the lease holder, and C its workers: kill (SIGKILL) or stop (SIGSTOP, frozen)")
	flag.DurationVar(&b.cSpread, "c-spread", time.Minute, "C's jobs are due at random over this long, from 3 s after pushing began; processes are killed until 5 s before its end")
	flag.DurationVar(&b.lSpread, "l-spread", 4*time.Second, "L's jobs are due at random over this long, from 3 s after pushing began")
	flag.StringVar(&b.observe, "observe", observeNone, "what the queues under test have attached, to measure its cost: none, or prom (dqprom's metrics, and a registry of them and the queue's gauges scraped every second)")
	cuts := cutParams{}
	flag.IntVar(&cuts.jobs, "n-jobs", 3_000, "jobs in N")
	flag.DurationVar(&cuts.spread, "n-spread", 50*time.Second, "N's jobs are due at random over this long, from -n-margin after pushing began")
	flag.DurationVar(&cuts.margin, "n-margin", 5*time.Second, "N's first due time is this long after pushing began; pushing should end before it")
	flag.DurationVar(&cuts.every, "n-cut", time.Second, "N cuts every connection through the relay this often (0: never)")
	flag.DurationVar(&cuts.down, "n-down", 0, "N's relay stays down this long at each cut, closing the connections it accepts (0: up again at once)")
	flag.DurationVar(&cuts.stall, "n-stall", 0, "N has every connection through the relay go silent this long after the first due time (0: never)")
	flag.DurationVar(&cuts.delay, "n-delay", 0, "N's relay delays what it passes on by this much each way (a round trip takes twice as long more)")
	flag.DurationVar(&cuts.readTimeout, "n-read-timeout", 0, "N's clients' ReadTimeout (0: go-redis's default, 3s)")
	flag.StringVar(&cuts.starters, "n-start", "consumers", "which of N's processes call Start: consumers, producer or all")
	nMethods := flag.String("n-methods", "consume,pop", "N's consumer processes, one per item: consume (Consume with 16 handlers) or pop (16 goroutines calling Pop and Finish)")
	flag.StringVar(&cuts.timeline, "n-timeline", "", "folder for a CSV timeline of each N run (empty: none)")
	flag.StringVar(&cuts.logLevel, "n-log", "", "log level of N's queues on stderr: debug, info or warn (empty: slog's default)")
	hog := flag.Float64("hog", 0, "share of the machine's CPU that a competing process keeps busy while the scenarios run, in bursts on every core (0: none)")
	flag.Parse()
	b.callerIDs = *ids == "caller"
	if *hog != 0 {
		stopHog, err := startHog(*hog)
		if err != nil {
			return err
		}
		defer stopHog()
	}

	stealStart := readCPU()
	withCuts := false
	var rest []string
	for _, id := range strings.Split(*only, ",") {
		if strings.EqualFold(strings.TrimSpace(id), cutScenarioID) {
			withCuts = true
		} else {
			rest = append(rest, id)
		}
	}
	var inProcess []scenario
	var layouts []*layoutScenario
	var err error
	if chosen := strings.Join(rest, ","); !withCuts || strings.TrimSpace(strings.ReplaceAll(chosen, ",", "")) != "" {
		if inProcess, layouts, err = chooseScenarios(chosen); err != nil {
			return err
		}
	}
	if cuts.methods, err = listFlag("n-methods", *nMethods, "pop", "consume"); err != nil {
		return err
	}
	topologies, err := listFlag("topology", *topology, "single", "split", "multi")
	if err != nil {
		return err
	}
	methods, err := listFlag("method", *method, "pop", "consume")
	if err != nil {
		return err
	}
	switch {
	case *runs < 1:
		return fmt.Errorf("-runs %d: at least 1", *runs)
	case backlogJobs < 1:
		return fmt.Errorf("-s7-jobs %d: at least 1", backlogJobs)
	case overviewTopics < 1:
		return fmt.Errorf("-s8-topics %d: at least 1", overviewTopics)
	case overviewLoad < time.Second:
		return fmt.Errorf("-s8-load %v: at least 1s", overviewLoad)
	case b.lJobs < 1:
		return fmt.Errorf("-l-jobs %d: at least 1", b.lJobs)
	case b.consumers < 1:
		return fmt.Errorf("-consumers %d: at least 1", b.consumers)
	case b.producers < 1:
		return fmt.Errorf("-producers %d: at least 1", b.producers)
	case *ids != "generated" && *ids != "caller":
		return fmt.Errorf("-ids %q: generated or caller", *ids)
	case *killWith != "kill" && *killWith != "stop":
		return fmt.Errorf("-k-signal %q: kill or stop", *killWith)
	case b.lSpread < time.Millisecond:
		return fmt.Errorf("-l-spread %v: at least 1ms", b.lSpread)
	case b.cSpread < 10*time.Second:
		return fmt.Errorf("-c-spread %v: at least 10s", b.cSpread)
	case b.observe != observeNone && b.observe != observeProm:
		return fmt.Errorf("-observe %q: none or prom", b.observe)
	case cuts.jobs < 1:
		return fmt.Errorf("-n-jobs %d: at least 1", cuts.jobs)
	case cuts.spread < time.Millisecond:
		return fmt.Errorf("-n-spread %v: at least 1ms", cuts.spread)
	case cuts.starters != "consumers" && cuts.starters != "producer" && cuts.starters != "all":
		return fmt.Errorf("-n-start %q: consumers, producer or all", cuts.starters)
	case cuts.every < 0 || cuts.down < 0 || cuts.stall < 0 || cuts.delay < 0 || cuts.margin < 0:
		return errors.New("-n-cut, -n-down, -n-stall, -n-delay and -n-margin: not negative")
	case cuts.every > 0 && cuts.down >= cuts.every:
		return fmt.Errorf("-n-down %v: shorter than -n-cut %v", cuts.down, cuts.every)
	}

	b.killSignal = syscall.SIGKILL
	if *killWith == "stop" {
		b.killSignal = syscall.SIGSTOP
	}

	where := *addr
	switch {
	case *cluster:
		addrs, stop, err := startCluster()
		if err != nil {
			return err
		}
		defer stop()
		b.client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 64})
		b.addrs, b.cluster = addrs, true
		for _, a := range addrs {
			b.nodes = append(b.nodes, redis.NewClient(&redis.Options{Addr: a}))
		}
		where = fmt.Sprintf("a 3-master cluster on %s", strings.Join(addrs, ", "))
	default:
		if *addr == "" {
			srv, stop, err := startServer()
			if err != nil {
				return err
			}
			defer stop()
			where = srv.Addr
		}
		b.client = redis.NewClient(&redis.Options{Addr: where, PoolSize: 64})
		b.addrs = []string{where}
		b.nodes = []*redis.Client{redis.NewClient(&redis.Options{Addr: where})}
	}
	defer b.client.Close()
	for _, n := range b.nodes {
		defer n.Close()
		if err := n.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("redis at %s: %w", n.Options().Addr, err)
		}
	}

	hogged := ""
	if *hog != 0 {
		hogged = fmt.Sprintf(", beside a process keeping %.1f %% of the CPU busy", *hog*100)
	}
	observed := ""
	if b.observe != observeNone {
		observed = ", queues observed by " + b.observe
	}
	fmt.Printf("# dqbench: %d runs each, Redis %s at %s, %s/%s, %d CPUs, %s%s%s\n\n",
		*runs, redisVersion(ctx, b.nodes[0]), where, runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), hogged, observed)
	if len(inProcess) > 0 {
		fmt.Println("| scenario | figure | median | min – max |")
		fmt.Println("|---|---|---|---|")
	}
	for _, s := range inProcess {
		var all []figures
		for i := range *runs {
			if err := b.reset(ctx); err != nil {
				return err
			}
			f, err := s.run(ctx, b)
			if err != nil {
				return fmt.Errorf("%s run %d: %w", s.id, i+1, err)
			}
			all = append(all, f)
		}
		for i, f := range all[0] {
			vals := make([]float64, len(all))
			for r := range all {
				vals[r] = all[r][i].value
			}
			slices.Sort(vals)
			fmt.Printf("| %s %s | %s | %s %s | %s – %s |\n", strings.ToUpper(s.id), s.title, f.name,
				num(median(vals)), f.unit, num(vals[0]), num(vals[len(vals)-1]))
		}
	}
	if len(layouts) > 0 {
		if len(inProcess) > 0 {
			fmt.Println()
		}
		if err := b.runLayouts(ctx, layouts, *runs, topologies, methods); err != nil {
			return err
		}
	}
	if withCuts {
		if len(inProcess)+len(layouts) > 0 {
			fmt.Println()
		}
		if err := b.runCuts(ctx, cuts, *runs); err != nil {
			return err
		}
	}
	fmt.Printf("\nCPU steal during the sitting: %s %% of the machine's CPU time (/proc/stat).\n",
		cell(stealPercent(stealStart, readCPU())))
	if *plots != "" {
		suffix := ""
		if *cluster {
			suffix = "-cluster"
		}
		return b.writeCharts(*plots, suffix)
	}
	return nil
}

// chooseScenarios picks the scenarios -only names: with none named, the
// in-process ones, s1 to s8.
func chooseScenarios(only string) ([]scenario, []*layoutScenario, error) {
	want := map[string]bool{}
	for _, id := range strings.Split(only, ",") {
		if id = strings.ToLower(strings.TrimSpace(id)); id != "" {
			want[id] = true
		}
	}
	all := len(want) == 0
	var inProcess []scenario
	var layouts []*layoutScenario
	for _, s := range scenarios {
		if all || want[s.id] {
			inProcess = append(inProcess, s)
			delete(want, s.id)
		}
	}
	for _, s := range namedScenarios {
		if want[s.id] {
			inProcess = append(inProcess, s)
			delete(want, s.id)
		}
	}
	for _, s := range layoutScenarios {
		if want[s.id] {
			layouts = append(layouts, s)
			delete(want, s.id)
		}
	}
	for id := range want {
		return nil, nil, fmt.Errorf("-only: no scenario %q", id)
	}
	return inProcess, layouts, nil
}

// listFlag splits a comma-separated flag value, each item one of allowed.
func listFlag(name, value string, allowed ...string) ([]string, error) {
	var items []string
	for _, v := range strings.Split(value, ",") {
		v = strings.TrimSpace(v)
		if v == "" {
			continue
		}
		if !slices.Contains(allowed, v) {
			return nil, fmt.Errorf("-%s: %q is none of %s", name, v, strings.Join(allowed, ", "))
		}
		items = append(items, v)
	}
	if len(items) == 0 {
		return nil, fmt.Errorf("-%s: none given", name)
	}
	return items, nil
}

func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// num formats a figure of the tables as the charts' ticks show it.
var num = svgchart.Number

// percentile of sorted durations, in milliseconds.
func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p / 100 * float64(len(sorted)-1))
	return float64(sorted[i].Microseconds()) / 1000
}
