// Command periodic runs a schedule: a "digest" every second, pushed by the
// queue itself, once per tick, however many copies of this program run.
// Each tick's job says which tick it is for (RunAt) and how late it came.
//
//	go run ./examples/periodic                      # on an embedded miniredis
//	REDIS_ADDR=127.0.0.1:6379 go run ./examples/periodic
//
// With a real Redis, run it in two terminals: each digest is printed by
// one of them, and killing either loses no tick.
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
		fmt.Fprintln(os.Stderr, "periodic:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	// In your code: client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	client, closeClient, err := exampleredis.Client()
	if err != nil {
		return err
	}
	defer closeClient()

	q, err := delayqueue.New(client, delayqueue.WithName("periodic"))
	if err != nil {
		return err
	}
	defer q.Close(context.WithoutCancel(ctx))
	if err := q.Start(ctx); err != nil { // this process fires schedules
		return err
	}

	// Creating it again replaces it: every copy of the program may do so.
	// A daily one would be Cron: "0 8 * * *", Location: berlin.
	err = q.Schedule(ctx, delayqueue.Schedule{
		Name:  "digest",
		Every: time.Second,
		Job:   delayqueue.Job{Topic: "digest.send", Body: []byte("the digest")},
	})
	if err != nil {
		return err
	}
	list, err := q.Schedules(ctx)
	if err != nil {
		return err
	}
	for _, s := range list {
		fmt.Printf("schedule %s every %v, next tick %s\n", s.Name, s.Every, s.Next.Format(time.TimeOnly))
	}

	// Five digests, then stop (Ctrl-C stops earlier).
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n := 0
	err = q.Consume(ctx, "digest.send", func(ctx context.Context, job *delayqueue.Job) error {
		fmt.Printf("%s for the tick at %s, %v late\n", job.Body, job.RunAt.Format(time.TimeOnly+".000"),
			time.Since(job.RunAt).Round(time.Millisecond))
		if n++; n == 5 {
			cancel()
		}
		return nil
	}, delayqueue.ConsumeOptions{Concurrency: 1})
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	// The schedule stays in Redis for the next run; a program that is done
	// with it says so.
	return q.Unschedule(context.WithoutCancel(ctx), "digest")
}
