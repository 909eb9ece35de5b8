// Command ratelimit sends SMS reminders through a provider that takes at
// most 5 requests in flight and 20 per second from all its clients
// together, and answers 429 with Retry-After beyond. Two workers (two
// queues here; two processes in production) share the provider's limits
// through a topic limit stored in Redis, so they stay within it together;
// a 429 all the same (the provider's window runs on its own clock) is
// snoozed for its Retry-After, which neither counts an attempt nor logs a
// failure. The provider is a local test server.
//
//	go run ./examples/ratelimit
package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/examples/internal/exampleredis"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "ratelimit:", err)
		os.Exit(1)
	}
}

// provider accepts at most inFlight requests at once and rate per second
// (a sliding window), and answers 429 with Retry-After: 1 beyond.
type provider struct {
	inFlight, rate int

	mu      sync.Mutex
	running int
	recent  []time.Time
	most    int
	refused int
}

func (p *provider) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	now := time.Now()
	p.mu.Lock()
	for len(p.recent) > 0 && now.Sub(p.recent[0]) >= time.Second {
		p.recent = p.recent[1:]
	}
	if p.running >= p.inFlight || len(p.recent) >= p.rate {
		p.refused++
		p.mu.Unlock()
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	p.running++
	p.most = max(p.most, p.running)
	p.recent = append(p.recent, now)
	p.mu.Unlock()
	time.Sleep(50 * time.Millisecond) // sending the SMS
	p.mu.Lock()
	p.running--
	p.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

// send posts one SMS. A 429 snoozes the job for the provider's Retry-After:
// not a failure of the job's. (RetryIn would count the attempt.)
func send(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return fmt.Errorf("%v: %w", err, delayqueue.ErrSkipRetry)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	switch code := resp.StatusCode; {
	case code < 300:
		return nil
	case code == http.StatusTooManyRequests:
		wait := time.Second
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
			wait = time.Duration(s) * time.Second
		}
		return delayqueue.Snooze(wait)
	default:
		return fmt.Errorf("provider answered %d", code)
	}
}

func run(ctx context.Context) error {
	// exampleredis runs the example anywhere (a real Redis at $REDIS_ADDR,
	// else an embedded miniredis). In your code:
	// client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	client, closeClient, err := exampleredis.Client()
	if err != nil {
		return err
	}
	defer closeClient()
	sms := &provider{inFlight: 5, rate: 20}
	srv := httptest.NewServer(sms)
	defer srv.Close()

	// Two workers, each with 8 handlers: 16 would overrun the provider.
	var workers []*delayqueue.DelayQueue
	for range 2 {
		q, err := delayqueue.New(client, delayqueue.WithName("reminders"))
		if err != nil {
			return err
		}
		defer q.Close(context.WithoutCancel(ctx))
		if err := q.Start(ctx); err != nil {
			return err
		}
		workers = append(workers, q)
	}
	// Once, by deployment or by an operator (dqctl limits set sms
	// --concurrency 5 --rate 20): every process obeys it.
	if err := workers[0].SetLimits(ctx, "sms", delayqueue.Limits{Concurrency: 5, Rate: 20, Per: time.Second}); err != nil {
		return err
	}

	const n = 60
	for i := range n {
		job := &delayqueue.Job{ID: fmt.Sprintf("reminder-%02d", i), Topic: "sms", Body: []byte(srv.URL)}
		if _, err := workers[0].Push(ctx, job); err != nil {
			return err
		}
	}
	start := time.Now()
	var sent atomic.Int64
	cctx, stopConsuming := context.WithCancel(ctx)
	defer stopConsuming()
	var wg sync.WaitGroup
	errs := make(chan error, len(workers))
	for _, q := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- q.Consume(cctx, "sms", func(ctx context.Context, job *delayqueue.Job) error {
				err := send(ctx, string(job.Body))
				if err == nil && sent.Add(1) == n {
					stopConsuming()
				}
				return err
			}, delayqueue.ConsumeOptions{Concurrency: 8})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	sms.mu.Lock()
	defer sms.mu.Unlock()
	fmt.Printf("%d reminders sent in %.1fs (the provider's 20/s allows no less than %.1fs)\n",
		sent.Load(), time.Since(start).Seconds(), float64(n-sms.rate)/float64(sms.rate))
	fmt.Printf("at most %d in flight at the provider (its limit: %d); %d answered 429 and snoozed\n",
		sms.most, sms.inFlight, sms.refused)
	return nil
}
