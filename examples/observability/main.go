// Command observability runs a queue with its Prometheus metrics (dqprom)
// and OpenTelemetry tracing (dqotel) plugged in: it pushes jobs due over two
// seconds on two topics, consumes them with handlers that fail now and
// then, prints what Prometheus scrapes from /metrics (the delayqueue_
// lines) and what the traces hold, then exits.
//
//	go run ./examples/observability                        # on an embedded miniredis
//	REDIS_ADDR=127.0.0.1:6379 go run ./examples/observability
//	go run ./examples/observability -svg lateness.svg      # and draw the scraped lateness histogram
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/dqotel"
	"github.com/dqueue/delayqueue/dqprom"
	"github.com/dqueue/delayqueue/examples/internal/exampleredis"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func main() {
	cfg := config{topics: map[string]float64{"email": 0.05, "sms": 0.2}}
	flag.IntVar(&cfg.jobs, "jobs", 2000, "jobs to push, spread over the topics")
	flag.DurationVar(&cfg.spread, "spread", 2*time.Second, "the jobs are due at random over this long")
	flag.StringVar(&cfg.svg, "svg", "", "also draw the scraped lateness histogram into this SVG file")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "observability:", err)
		os.Exit(1)
	}
}

// config is what to run.
type config struct {
	jobs   int
	spread time.Duration
	topics map[string]float64 // topic -> share of its handler's calls that fail
	svg    string             // "": no chart
}

// maxAttempts is each job's deliveries before the dead letters.
const maxAttempts = 3

func run(ctx context.Context, out io.Writer, cfg config) error {
	// exampleredis lives inside this repository, so that the example runs
	// anywhere (a real Redis at $REDIS_ADDR, else an embedded miniredis). In
	// your code: client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	client, closeClient, err := exampleredis.Client()
	if err != nil {
		return err
	}
	defer closeClient()

	// The metrics: counters and histograms fed by the queue's events...
	metrics := dqprom.New(dqprom.Options{Queue: "observability"})
	// The traces: a send span per push and a process span per handled job,
	// kept in memory here; a service gives dqotel its exporting
	// TracerProvider, or sets the global one.
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(context.WithoutCancel(ctx))
	tel, err := dqotel.New(dqotel.WithTracerProvider(tp))
	if err != nil {
		return err
	}
	opts := append([]delayqueue.Option{
		delayqueue.WithName("observability"), delayqueue.WithObserver(metrics),
		delayqueue.WithMaxAttempts(maxAttempts), delayqueue.WithBackoff(delayqueue.BackoffSchedule(200 * time.Millisecond)),
		// Failing handlers are logged at Warn; this example prints its scrape alone.
		delayqueue.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))),
	}, tel.Options()...)
	q, err := delayqueue.New(client, opts...)
	if err != nil {
		return err
	}
	defer q.Close(context.WithoutCancel(ctx))
	// ...and gauges read from Redis when scraped, on a registry of ours.
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics, metrics.Gauges(q))
	url, stopServer, err := serveMetrics(reg)
	if err != nil {
		return err
	}
	defer stopServer()

	if err := q.Start(ctx); err != nil {
		return err
	}
	if err := push(ctx, q, cfg); err != nil {
		return err
	}
	if err := consume(ctx, q, cfg); err != nil {
		return err
	}

	scraped, err := get(ctx, url)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "scraped %s (the delayqueue_ lines):\n", url)
	sc := bufio.NewScanner(strings.NewReader(scraped))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "delayqueue_") {
			fmt.Fprintln(out, sc.Text())
		}
	}
	printTraces(out, spans.GetSpans())
	if cfg.svg != "" {
		return drawLateness(scraped, cfg)
	}
	return nil
}

// printTraces says how many spans of each name the run made, and how one
// process span links to the send span of its job.
func printTraces(out io.Writer, spans tracetest.SpanStubs) {
	count := map[string]int{}
	var names []string
	var linked *tracetest.SpanStub
	for i, s := range spans {
		if count[s.Name] == 0 {
			names = append(names, s.Name)
		}
		count[s.Name]++
		if linked == nil && s.SpanKind == trace.SpanKindConsumer && len(s.Links) > 0 {
			linked = &spans[i]
		}
	}
	slices.Sort(names)
	fmt.Fprintln(out, "traced:")
	for _, name := range names {
		fmt.Fprintf(out, "  %d %q spans\n", count[name], name)
	}
	if linked != nil {
		fmt.Fprintf(out, "  e.g. %q in trace %s links to its job's send span in trace %s\n",
			linked.Name, linked.SpanContext.TraceID(), linked.Links[0].SpanContext.TraceID())
	}
}

// serveMetrics serves reg at /metrics on a free loopback port, as a service
// does for Prometheus, and returns the URL and a function that stops it.
func serveMetrics(reg *prometheus.Registry) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln) // ErrServerClosed, once stopped
	}()
	return "http://" + ln.Addr().String() + "/metrics", func() {
		_ = srv.Close()
		<-served
	}, nil
}

// push pushes cfg.jobs jobs, round robin over the topics, each due at random
// within cfg.spread.
func push(ctx context.Context, q *delayqueue.DelayQueue, cfg config) error {
	topics := make([]string, 0, len(cfg.topics))
	for t := range cfg.topics {
		topics = append(topics, t)
	}
	jobs := make([]*delayqueue.Job, cfg.jobs)
	for i := range jobs {
		jobs[i] = &delayqueue.Job{
			Topic: topics[i%len(topics)],
			Body:  fmt.Appendf(nil, "message #%d", i),
			Delay: time.Duration(rand.Int64N(int64(cfg.spread))),
		}
	}
	_, err := q.PushMany(ctx, jobs)
	return err
}

// consume runs four handlers per topic until every job is finished or dead.
// A handler works for up to 4 ms and fails as often as its topic says.
func consume(ctx context.Context, q *delayqueue.DelayQueue, cfg config) error {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var settled atomic.Int64
	settle := func() {
		if settled.Add(1) == int64(cfg.jobs) {
			cancel() // the last one: Consume settles it, and returns
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(cfg.topics))
	for topic, failing := range cfg.topics {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- q.Consume(cctx, topic, func(ctx context.Context, job *delayqueue.Job) error {
				work := time.NewTimer(time.Duration(rand.Int64N(int64(4 * time.Millisecond))))
				defer work.Stop()
				select {
				case <-work.C:
				case <-ctx.Done():
					return ctx.Err()
				}
				if rand.Float64() < failing {
					if job.Attempts == maxAttempts {
						defer settle() // to the dead letters
					}
					return errors.New("the provider said no")
				}
				defer settle()
				return nil
			}, delayqueue.ConsumeOptions{Concurrency: 4})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return ctx.Err()
}

// get reads url as Prometheus does.
func get(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
