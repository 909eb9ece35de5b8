// Command retry-backoff sends a notification through a flaky mail server:
// each failure is retried on the schedule 0s, 0s, 2m, 10m, 10m, 1h, 2h, 6h,
// 15h, and after the tenth attempt the job goes to the dead letters, where it
// is listed with its last error. Time runs 10,000 times faster here, so the
// whole schedule takes about 8 seconds.
//
//	go run ./examples/retry-backoff
package main

import (
	"context"
	"errors"
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
		fmt.Fprintln(os.Stderr, "retry-backoff:", err)
		os.Exit(1)
	}
}

const speedup = 10_000

var schedule = []time.Duration{0, 0, 2 * time.Minute, 10 * time.Minute, 10 * time.Minute,
	time.Hour, 2 * time.Hour, 6 * time.Hour, 15 * time.Hour}

func run(ctx context.Context) error {
	// exampleredis lives inside this repository, so that the example runs
	// anywhere (a real Redis at $REDIS_ADDR, else an embedded miniredis). In
	// your code: client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	client, closeClient, err := exampleredis.Client()
	if err != nil {
		return err
	}
	defer closeClient()

	scaled := make([]time.Duration, len(schedule))
	for i, d := range schedule {
		scaled[i] = d / speedup
	}
	q, err := delayqueue.New(client,
		delayqueue.WithName("notify"),
		delayqueue.WithBackoff(delayqueue.BackoffSchedule(scaled...)),
		delayqueue.WithMaxAttempts(len(schedule)+1), // the first try and one per delay
	)
	if err != nil {
		return err
	}
	defer q.Close(context.WithoutCancel(ctx))
	if err := q.Start(ctx); err != nil {
		return err
	}
	if _, err := q.Push(ctx, &delayqueue.Job{ID: "welcome-mail-7", Topic: "mail", Body: []byte("to: ada@example.com")}); err != nil {
		return err
	}

	var first time.Time
	ctx, stopWorker := context.WithCancel(ctx)
	err = q.Consume(ctx, "mail", func(ctx context.Context, job *delayqueue.Job) error {
		if job.Attempts == 1 {
			first = time.Now()
		}
		elapsed := time.Since(first) * speedup // in the schedule's time
		fmt.Printf("attempt %2d at +%-9v %s: mail server says 421\n", job.Attempts, elapsed.Round(time.Second), job.Body)
		if job.Attempts == job.MaxAttempts {
			defer stopWorker() // this failure is the last
		}
		return errors.New("421 service not available, try later")
	}, delayqueue.ConsumeOptions{})
	if err != nil {
		return err
	}

	var page delayqueue.JobPage
	for first := true; first || page.Next != ""; first = false {
		page, err = q.List(context.WithoutCancel(ctx), "mail", delayqueue.StateDead, delayqueue.ListOptions{Cursor: page.Next})
		if err != nil {
			return err
		}
		for _, job := range page.Jobs {
			fmt.Printf("dead letter %s after %d attempts, last error: %s\n", job.ID, job.Attempts, job.LastError)
		}
	}
	return nil
}
