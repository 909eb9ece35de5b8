package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
)

// roleFlag, as the first argument, makes the binary a child process of a
// layout scenario (see protocol.go). It is left out of the command's own
// flags, so -h does not show it.
const roleFlag = "-role"

// layoutTopic is the one topic of the layout scenarios.
const layoutTopic = "bench"

// dueKind says how a layout job is made due.
type dueKind string

const (
	dueAt   dueKind = "at"   // at a time given by the parent, spread at random (RunAt)
	dueNow  dueKind = "now"  // at once
	dueHour dueKind = "hour" // in an hour (Delay)
)

// design is one of the two designs under test as one process runs it: the
// queue (dq) or the minimal baseline (min).
type design interface {
	// push stores one job with body, due at due (Unix ms), made due as how
	// says.
	push(ctx context.Context, body []byte, due int64, how dueKind) error
	// consume takes jobs with 16 workers until ctx ends or an error,
	// calling got for each.
	consume(ctx context.Context, got func(delivery)) error
	close(ctx context.Context) error
}

// childConfig is a child's command line.
type childConfig struct {
	role    string // producer, consumer or single
	impl    string // dq or min
	method  string // pop or consume (dq consumers)
	addrs   []string
	cluster bool
	queue   string
	jobs    int
	// producers: goroutines pushing the jobs (-producers; 0: the default)
	producers int
	due       dueKind
	spread    time.Duration
	start     bool // dq: call Start; min: run the mover
	timeout   time.Duration
	observe   string // dq: what the queue has attached (-observe)
	// endure (dq): Redis errors of pushes, pops and finishes are retried
	// and counted, not the end of the run, and jobs carry IDs of the
	// child's (their numbers), so that a push retried after a lost reply
	// makes no second job. For runs through a relay that cuts connections.
	endure bool
	// callerIDs (dq): jobs carry their numbers as IDs, as -endure's do.
	callerIDs bool
	logLevel  string // dq: the queue's log level on stderr; empty: slog's default
	// readTimeout is the client's ReadTimeout; 0: go-redis's default.
	readTimeout time.Duration
	ttr         time.Duration // dq: the jobs' TTR; 0: a minute
	// work (dq, consume) is how long each handler takes; its span is
	// reported. handlers is Consume's Concurrency.
	work     time.Duration
	handlers int
	// flushEach: each receipt is written out before the handler returns,
	// for a process that may be killed: a job it finished is then never
	// one the parent did not hear of.
	flushEach bool
}

func parseChildFlags(args []string) (*childConfig, error) {
	c := &childConfig{}
	fs := flag.NewFlagSet("dqbench "+roleFlag, flag.ContinueOnError)
	fs.StringVar(&c.role, "role", "", "producer, consumer or single")
	fs.StringVar(&c.impl, "impl", "dq", "dq or min")
	fs.StringVar(&c.method, "method", "pop", "pop or consume")
	addrs := fs.String("addrs", "", "comma-separated Redis addresses")
	fs.BoolVar(&c.cluster, "cluster", false, "addrs are Redis Cluster masters")
	fs.StringVar(&c.queue, "queue", "", "queue name")
	fs.IntVar(&c.jobs, "jobs", 0, "jobs to push")
	fs.IntVar(&c.producers, "producers", producers, "goroutines pushing the jobs")
	due := fs.String("due", string(dueNow), "how jobs are due: at, now or hour")
	fs.DurationVar(&c.spread, "spread", 0, "with -due at: jobs are due at random over this long from the base time")
	fs.BoolVar(&c.start, "start", false, "dq: call Start; min: run the mover")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Minute, "stop after this long in any case")
	fs.StringVar(&c.observe, "observe", observeNone, "dq: what the queue has attached: none or prom")
	fs.BoolVar(&c.endure, "endure", false, "dq: retry and count Redis errors of pushes, pops and finishes; jobs carry their numbers as IDs")
	fs.BoolVar(&c.callerIDs, "caller-ids", false, "dq: jobs carry their numbers as IDs")
	fs.DurationVar(&c.readTimeout, "read-timeout", 0, "the client's ReadTimeout (0: go-redis's default, 3s)")
	fs.DurationVar(&c.ttr, "ttr", time.Minute, "dq: the jobs' TTR")
	fs.DurationVar(&c.work, "work", 0, "dq, consume: each handler takes this long, and reports its span")
	fs.IntVar(&c.handlers, "handlers", workers, "dq, consume: Consume's Concurrency")
	fs.BoolVar(&c.flushEach, "flush-each", false, "write each receipt out at once, before the job is finished (a process that may be killed)")
	fs.StringVar(&c.logLevel, "log", "", "dq: log the queue at this level (debug, info, warn) on stderr, with microsecond times")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	c.addrs = strings.Split(*addrs, ",")
	c.due = dueKind(*due)
	switch {
	case c.role != "producer" && c.role != "consumer" && c.role != "single":
		return nil, fmt.Errorf("unknown role %q", c.role)
	case c.impl != "dq" && c.impl != "min":
		return nil, fmt.Errorf("unknown implementation %q", c.impl)
	case c.method != "pop" && c.method != "consume":
		return nil, fmt.Errorf("unknown consumer method %q", c.method)
	case c.due != dueAt && c.due != dueNow && c.due != dueHour:
		return nil, fmt.Errorf("unknown due kind %q", c.due)
	case c.producers < 1:
		return nil, fmt.Errorf("-producers %d: at least 1", c.producers)
	case c.observe != observeNone && c.observe != observeProm:
		return nil, fmt.Errorf("unknown observation %q", c.observe)
	case c.logLevel != "" && c.logLevel != "debug" && c.logLevel != "info" && c.logLevel != "warn":
		return nil, fmt.Errorf("unknown log level %q", c.logLevel)
	case *addrs == "" || c.queue == "":
		return nil, errors.New("-addrs and -queue are required")
	}
	return c, nil
}

// runChild is main for a child process. Its one result line on stdout
// carries any error of the run; the error it returns is for those that
// leave no result to write.
func runChild(args []string) error {
	c, err := parseChildFlags(args)
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx, cancel = context.WithTimeout(ctx, c.timeout)
	defer cancel()
	// The parent ends stdin to stop the child, and so does its death.
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	base := make(chan int64, 1)
	go readControl(os.Stdin, base, stop)

	out := newReporter(os.Stdout, c.flushEach)
	res := c.run(ctx, base, out)
	return out.finish(res)
}

// readControl reads the parent's lines: it passes on the base time of "go"
// and calls stop at the end of input.
func readControl(r io.Reader, base chan<- int64, stop func()) {
	defer stop()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), goPrefix); ok {
			ms, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return // a parent that says what it cannot mean is gone
			}
			select {
			case base <- ms:
			default:
			}
		}
	}
}

func (c *childConfig) client() redis.UniversalClient {
	if c.cluster {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.addrs, PoolSize: 64, ReadTimeout: c.readTimeout})
	}
	return redis.NewClient(&redis.Options{Addr: c.addrs[0], PoolSize: 64, ReadTimeout: c.readTimeout})
}

func (c *childConfig) open(ctx context.Context, client redis.UniversalClient) (design, error) {
	if c.impl == "min" {
		return openMinimal(client, c.queue, c.start), nil
	}
	ttr := c.ttr
	if ttr == 0 {
		ttr = time.Minute
	}
	opts := []delayqueue.Option{delayqueue.WithName(c.queue), delayqueue.WithDefaultTTR(ttr)}
	if c.logLevel != "" {
		opts = append(opts, delayqueue.WithLogger(childLogger(c.role+"/"+c.method, c.logLevel)))
	}
	calls := &reserveCalls{}
	opts = append(opts, delayqueue.WithObserver(calls))
	q, detach, err := openObserved(c.observe, func(more ...delayqueue.Option) (*delayqueue.DelayQueue, error) {
		return delayqueue.New(client, append(opts, more...)...)
	})
	if err != nil {
		return nil, err
	}
	d := &queue{q: q, method: c.method, detach: detach, endure: c.endure, callerIDs: c.callerIDs || c.endure, calls: calls, work: c.work, handlers: c.handlers}
	if c.start {
		if err := q.Start(ctx); err != nil {
			_ = d.close(ctx)
			return nil, err
		}
	}
	return d, nil
}

// run plays the child's role until it is done or stopped.
func (c *childConfig) run(ctx context.Context, base <-chan int64, out *reporter) (res childResult) {
	client := c.client()
	defer client.Close()
	d, err := c.open(ctx, client)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		if err := d.close(closeCtx); err != nil && res.Error == "" {
			res.Error = err.Error()
		}
	}()

	g, gctx := errgroup.WithContext(ctx)
	if c.role != "producer" {
		if q, ok := d.(*queue); ok {
			q.spanned = out.span
		}
		g.Go(func() error { return d.consume(gctx, out.record) })
	}
	if c.role != "consumer" {
		g.Go(func() error {
			select {
			case <-gctx.Done():
				return errors.New("stopped before the parent said go")
			case b := <-base:
				var err error
				res.Pushed, res.PushStart, res.PushEnd, err = c.pushAll(gctx, d, b)
				if err == nil && c.role == "producer" && c.start && c.impl == "dq" {
					<-gctx.Done() // its bucket handlers move the jobs until it is stopped
				}
				return err
			}
		})
	}
	out.line(readyLine)
	if err := g.Wait(); err != nil {
		res.Error = err.Error()
	}
	res.Received = out.received()
	if q, ok := d.(*queue); ok {
		res.Retried = int(q.retried.Load())
		res.Reserves, res.Empty, res.Unclaimed, res.Alone = int(q.calls.all.Load()), int(q.calls.empty.Load()), int(q.calls.unclaimed.Load()), int(q.calls.alone.Load())
	}
	return res
}

// childLogger logs at level on stderr, each line with the Unix time in µs
// and who logs (a child's role and method), so that the lines of several
// children can be merged and set beside a run's timeline.
func childLogger(who, level string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level)) // checked by parseChildFlags
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{
		Level: l,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Int64("us", a.Value.Time().UnixMicro())
			}
			return a
		},
	})).With("who", who)
}

// pushAll pushes c.jobs jobs with c.producers goroutines (0: the
// default, producers); base is the first due time (Unix ms) of jobs due
// at a given time. It returns how many it pushed, and when it began and
// ended in Unix µs.
func (c *childConfig) pushAll(ctx context.Context, d design, base int64) (n int, start, end int64, err error) {
	var pushed atomic.Int64
	began := time.Now()
	err = eachByGoroutines(ctx, cmp.Or(c.producers, producers), c.jobs, func(ctx context.Context, i int) error {
		var due int64
		switch c.due {
		case dueAt:
			due = base
			if c.spread > 0 {
				due += rand.Int64N(c.spread.Milliseconds())
			}
		case dueNow:
			due = time.Now().UnixMilli()
		case dueHour:
			due = time.Now().Add(time.Hour).UnixMilli()
		}
		if err := d.push(ctx, jobBody(i, due), due, c.due); err != nil {
			return err
		}
		pushed.Add(1)
		return nil
	})
	return int(pushed.Load()), began.UnixMicro(), time.Now().UnixMicro(), err
}

// queue is a child's handle on the queue under test.
type queue struct {
	q      *delayqueue.DelayQueue
	method string
	detach func() // ends what -observe attached
	endure bool   // -endure
	// callerIDs: -caller-ids or -endure
	callerIDs bool
	retried   atomic.Int64
	calls     *reserveCalls
	// work and handlers: -work and -handlers; spanned reports a span.
	work     time.Duration
	handlers int
	spanned  func(body []byte, start, end time.Time)
}

// reserveCalls counts the reserve calls of the queue, those that found
// no job, and of those the calls that came only to claim signals or to
// look for a lost one and found another process there first
// (delayqueue.EventReserveCall's Unclaimed), and those that carried no
// finish either (alone: a script call for nothing).
type reserveCalls struct{ all, empty, unclaimed, alone atomic.Int64 }

func (r *reserveCalls) Observe(_ context.Context, e delayqueue.Event) {
	if e.Kind == delayqueue.EventReserveCall {
		r.all.Add(1)
		if e.Count == 0 {
			r.empty.Add(1)
			if e.Finishes == 0 {
				r.alone.Add(1)
			}
		}
		if e.Unclaimed {
			r.unclaimed.Add(1)
		}
	}
}

func (d *queue) push(ctx context.Context, body []byte, due int64, how dueKind) error {
	job := &delayqueue.Job{Topic: layoutTopic, Body: body}
	switch how {
	case dueAt:
		job.RunAt = time.UnixMilli(due)
	case dueHour:
		job.Delay = time.Hour
	}
	if d.callerIDs {
		n, _, err := parseBody(body)
		if err != nil {
			return err
		}
		job.ID = "j" + strconv.Itoa(n) // pushed again, it exists already: nothing changes
	}
	if !d.endure {
		_, err := d.q.Push(ctx, job)
		return err
	}
	for {
		_, err := d.q.Push(ctx, job)
		switch {
		case err == nil:
			return nil
		case !d.again(ctx):
			return err
		}
	}
}

// again counts a Redis error that an enduring child retries, and waits a
// little before the retry; it reports false when ctx ended.
func (d *queue) again(ctx context.Context) bool {
	d.retried.Add(1)
	t := time.NewTimer(20 * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// consume runs 16 goroutines calling Pop and Finish, or Consume with
// -handlers handlers (each taking -work), until ctx ends.
func (d *queue) consume(ctx context.Context, got func(delivery)) error {
	if d.method == "consume" {
		err := d.q.Consume(ctx, layoutTopic, func(_ context.Context, job *delayqueue.Job) error {
			got(deliveryOf(job))
			if d.work > 0 {
				start := time.Now()
				time.Sleep(d.work) // the work
				d.spanned(job.Body, start, time.Now())
			}
			return nil
		}, delayqueue.ConsumeOptions{Concurrency: d.handlers})
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	for range workers {
		g.Go(func() error {
			for ctx.Err() == nil {
				job, err := d.q.Pop(ctx, layoutTopic, time.Second)
				switch {
				case err == nil:
					got(deliveryOf(job))
					if err := d.q.Finish(ctx, job.ID); err != nil && ctx.Err() == nil {
						if !d.endure {
							return err
						}
						d.retried.Add(1) // the job comes back after its TTR
					}
				case errors.Is(err, delayqueue.ErrNoJob):
				case ctx.Err() != nil:
					return nil
				case d.endure:
					d.again(ctx)
				default:
					return err
				}
			}
			return nil
		})
	}
	return g.Wait()
}

func (d *queue) close(ctx context.Context) error {
	d.detach()
	return d.q.Close(ctx)
}

// reporter writes a child's lines to stdout. Receipts are buffered and
// flushed every 10 ms, so that writing them costs the consumers little and
// the parent still sees them as they come; with flushEach, each is written
// out at once, so that a process killed mid-run has reported every job it
// received (the last 10 ms of receipts die with it otherwise, while their
// jobs are finished).
type reporter struct {
	mu        sync.Mutex
	w         *bufio.Writer
	flushEach bool
	buf       []byte
	n         int
	err       error // the first body that could not be read
	stop      chan struct{}
	done      chan struct{}
}

func newReporter(w io.Writer, flushEach bool) *reporter {
	r := &reporter{w: bufio.NewWriterSize(w, 64<<10), flushEach: flushEach, stop: make(chan struct{}), done: make(chan struct{})}
	go r.flushLoop()
	return r
}

func (r *reporter) flushLoop() {
	defer close(r.done)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-tick.C:
			r.mu.Lock()
			_ = r.w.Flush()
			r.mu.Unlock()
		}
	}
}

// delivery is a job as a design's consumer took it.
type delivery struct {
	body     []byte
	reserved time.Time // on the server's clock; zero when the design does not say
	attempt  int       // 1 for the first; 0 when the design does not say
}

// deliveryOf is a job the queue delivered. Its reservation began on the
// server's clock at ReservedUntil-TTR.
func deliveryOf(job *delayqueue.Job) delivery {
	return delivery{body: job.Body, reserved: job.ReservedUntil.Add(-job.TTR), attempt: job.Attempts}
}

// record reports one delivery.
func (r *reporter) record(d delivery) {
	at := time.Now()
	job, due, ok := r.parse(d.body)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	dueAt := time.UnixMilli(due)
	r.buf = appendReceipt(r.buf[:0], receipt{job: job, at: at, due: dueAt, early: !d.reserved.IsZero() && d.reserved.Before(dueAt), attempt: d.attempt})
	_, _ = r.w.Write(r.buf)
	if r.flushEach {
		_ = r.w.Flush()
	}
	r.n++
}

// parse reads a job's body; the first body it cannot read is the
// child's error.
func (r *reporter) parse(body []byte) (int, int64, bool) {
	job, due, err := parseBody(body)
	if err != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.err == nil {
			r.err = err
		}
		return 0, 0, false
	}
	return job, due, true
}

// span reports when a job's handler ran.
func (r *reporter) span(body []byte, start, end time.Time) {
	job, _, ok := r.parse(body)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf = appendSpan(r.buf[:0], span{job: job, start: start, end: end})
	_, _ = r.w.Write(r.buf)
}

func (r *reporter) received() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// line writes a line at once.
func (r *reporter) line(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = r.w.WriteString(s + "\n")
	_ = r.w.Flush()
}

// finish writes the result as the last line.
func (r *reporter) finish(res childResult) error {
	close(r.stop)
	<-r.done
	r.mu.Lock()
	if r.err != nil && res.Error == "" {
		res.Error = r.err.Error()
	}
	r.mu.Unlock()
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	r.line(string(b))
	return nil
}
