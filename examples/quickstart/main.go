// Command quickstart pushes a handful of jobs with different delays and
// prints each as it arrives, with how late it was, then exits.
//
//	go run ./examples/quickstart                      # on an embedded miniredis
//	REDIS_ADDR=127.0.0.1:6379 go run ./examples/quickstart
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/examples/internal/exampleredis"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
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

	q, err := delayqueue.New(client, delayqueue.WithName("quickstart"))
	if err != nil {
		return err
	}
	defer q.Close(context.WithoutCancel(ctx))
	if err := q.Start(ctx); err != nil {
		return err
	}

	delays := []time.Duration{2500 * time.Millisecond, 0, 1500 * time.Millisecond, 500 * time.Millisecond, 3 * time.Second, time.Second}
	due := map[string]time.Time{}
	for i, d := range delays {
		dueAt := time.Now().Add(d)
		id, err := q.Push(ctx, &delayqueue.Job{
			Topic: "reminder",
			Body:  fmt.Appendf(nil, "reminder #%d, due in %v", i+1, d),
			Delay: d,
		})
		if err != nil {
			return err
		}
		due[id] = dueAt
		fmt.Printf("pushed %s: reminder #%d in %v\n", id, i+1, d)
	}

	for len(due) > 0 {
		job, err := q.Pop(ctx, "reminder", 10*time.Second)
		if err != nil {
			return err
		}
		late := time.Since(due[job.ID])
		fmt.Printf("got    %s: %s (%.1f ms late)\n", job.ID, job.Body, float64(late.Microseconds())/1000)
		if err := q.Finish(ctx, job.ID); err != nil {
			return err
		}
		delete(due, job.ID)
	}
	fmt.Println("all jobs arrived")
	return nil
}
