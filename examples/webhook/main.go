// Command webhook delivers webhooks with Consume and lets each answer decide
// what happens next: 2xx finishes the job; 4xx sends it to the dead letters
// at once (no retry can mend a bad request); 429 comes back when the
// receiver's Retry-After says; 5xx retries on the queue's backoff. An admin
// step then lists the dead letters and requeues them once the receiver is
// fixed. The receiver is a local test server that answers by path.
//
//	go run ./examples/webhook
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
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/examples/internal/exampleredis"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "webhook:", err)
		os.Exit(1)
	}
}

// receiver answers /ok with 200, /gone with 404 until fixed, /busy with 429
// and Retry-After: 1 the first time, and /flaky with 503 twice.
type receiver struct {
	mu    sync.Mutex
	calls map[string]int
	fixed bool
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	r.calls[req.URL.Path]++
	n, fixed := r.calls[req.URL.Path], r.fixed
	r.mu.Unlock()
	switch {
	case req.URL.Path == "/gone" && !fixed:
		w.WriteHeader(http.StatusNotFound)
	case req.URL.Path == "/busy" && n == 1:
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
	case req.URL.Path == "/flaky" && n <= 2:
		w.WriteHeader(http.StatusServiceUnavailable)
	default:
		w.WriteHeader(http.StatusOK)
	}
}

// deliver posts one webhook and turns the answer into the job's outcome.
func deliver(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return fmt.Errorf("%v: %w", err, delayqueue.ErrSkipRetry) // a bad URL stays bad
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err // the network: retry on the backoff
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
		return delayqueue.RetryIn(wait, fmt.Errorf("%s answered %d", url, code))
	case code < 500:
		return fmt.Errorf("%s answered %d: %w", url, code, delayqueue.ErrSkipRetry)
	default:
		return fmt.Errorf("%s answered %d", url, code) // the queue's backoff
	}
}

func run(ctx context.Context) error {
	// exampleredis lives inside this repository, so that the example runs
	// anywhere (a real Redis at $REDIS_ADDR, else an embedded miniredis). In
	// your code: client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	client, closeClient, err := exampleredis.Client()
	if err != nil {
		return err
	}
	defer closeClient()

	rcv := &receiver{calls: map[string]int{}}
	srv := httptest.NewServer(rcv)
	defer srv.Close()

	q, err := delayqueue.New(client,
		delayqueue.WithName("webhooks"),
		delayqueue.WithBackoff(delayqueue.BackoffSchedule(200*time.Millisecond, 400*time.Millisecond)),
		delayqueue.WithMaxAttempts(5),
	)
	if err != nil {
		return err
	}
	defer q.Close(context.WithoutCancel(ctx))
	if err := q.Start(ctx); err != nil { // this worker also moves due jobs
		return err
	}

	paths := []string{"/ok", "/gone", "/busy", "/flaky"}
	for _, p := range paths {
		if _, err := q.Push(ctx, &delayqueue.Job{ID: "hook" + p, Topic: "webhook", Body: []byte(srv.URL + p)}); err != nil {
			return err
		}
	}

	start := time.Now()
	var mu sync.Mutex
	delivered := map[string]bool{}
	cctx, stopConsuming := context.WithCancel(ctx)
	defer stopConsuming()
	done := make(chan error, 1)
	go func() {
		done <- q.Consume(cctx, "webhook", func(ctx context.Context, job *delayqueue.Job) error {
			err := deliver(ctx, string(job.Body))
			fmt.Printf("%5dms  %-10s attempt %d: %v\n", time.Since(start).Milliseconds(), job.ID, job.Attempts, outcome(err))
			if err == nil {
				mu.Lock()
				delivered[job.ID] = true
				mu.Unlock()
			}
			return err
		}, delayqueue.ConsumeOptions{Concurrency: 4})
	}()

	// Wait until three are delivered and one is dead.
	for {
		mu.Lock()
		n := len(delivered)
		mu.Unlock()
		st, err := q.Counts(ctx, "webhook")
		if err != nil {
			return err
		}
		if n == 3 && st.Dead == 1 {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}

	// The admin step: look at the dead letters, fix the receiver, requeue.
	var page delayqueue.JobPage
	for first := true; first || page.Next != ""; first = false {
		if page, err = q.List(ctx, "webhook", delayqueue.StateDead, delayqueue.ListOptions{Cursor: page.Next}); err != nil {
			return err
		}
		for _, job := range page.Jobs {
			fmt.Printf("dead: %s after %d attempt(s): %s\n", job.ID, job.Attempts, job.LastError)
		}
	}
	rcv.mu.Lock()
	rcv.fixed = true
	rcv.mu.Unlock()
	n, err := q.RequeueAllDead(ctx, "webhook")
	if err != nil {
		return err
	}
	fmt.Printf("requeued %d dead letter(s)\n", n)
	for {
		mu.Lock()
		all := len(delivered) == len(paths)
		mu.Unlock()
		if all {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	stopConsuming()
	if err := <-done; err != nil {
		return err
	}
	fmt.Println("all webhooks delivered")
	return nil
}

// outcome says what the queue does with a handler's error.
func outcome(err error) string {
	var retryIn *delayqueue.RetryInError
	switch {
	case err == nil:
		return "delivered"
	case errors.Is(err, delayqueue.ErrSkipRetry):
		return fmt.Sprintf("%v -> dead letters now", err)
	case errors.As(err, &retryIn):
		return fmt.Sprintf("%v -> back in %v", retryIn.Cause, retryIn.Delay)
	default:
		return fmt.Sprintf("%v -> backoff", err)
	}
}
