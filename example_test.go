package delayqueue_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/dqueue/delayqueue"
	"github.com/redis/go-redis/v9"
)

func Example() {
	ctx := context.Background()
	srv, _ := miniredis.Run() // any Redis will do: a server, Sentinel or Cluster
	defer srv.Close()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer client.Close()

	q, err := delayqueue.New(client, delayqueue.WithName("orders"))
	if err != nil {
		panic(err)
	}
	defer q.Close(ctx)
	if err := q.Start(ctx); err != nil { // move due jobs to their ready lists
		panic(err)
	}

	id, err := q.Push(ctx, &delayqueue.Job{
		ID:    "cancel-order-42", // a caller-chosen ID makes pushing it again harmless
		Topic: "order.cancel",
		Body:  []byte(`{"order":42}`),
		Delay: 50 * time.Millisecond,
	})
	if err != nil {
		panic(err)
	}
	job, _ := q.Get(ctx, id)
	fmt.Println(job.ID, job.State)

	job, err = q.Pop(ctx, "order.cancel", 5*time.Second) // waits until it is due
	if err != nil {
		panic(err)
	}
	fmt.Println(job.ID, job.State, "attempt", job.Attempts, string(job.Body))
	if err := q.Finish(ctx, job.ID); err != nil {
		panic(err)
	}
	_, err = q.Get(ctx, id)
	fmt.Println(err)
	// Output:
	// cancel-order-42 delayed
	// cancel-order-42 reserved attempt 1 {"order":42}
	// delayqueue: job not found: "cancel-order-42"
}

func ExampleDelayQueue_Remove() {
	ctx := context.Background()
	srv, _ := miniredis.Run()
	defer srv.Close()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer client.Close()
	q, _ := delayqueue.New(client)
	defer q.Close(ctx)

	// Cancel the order in 30 minutes, unless it is paid before then.
	id, _ := q.Push(ctx, &delayqueue.Job{Topic: "order.cancel", Body: []byte("42"), Delay: 30 * time.Minute})
	// ... the payment arrives:
	fmt.Println(q.Remove(ctx, id))
	// Output:
	// <nil>
}

// A handler says what should happen to a job that it could not do.
func ExampleRetryIn() {
	ctx := context.Background()
	srv, _ := miniredis.Run()
	defer srv.Close()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer client.Close()
	q, _ := delayqueue.New(client)
	defer q.Close(ctx)

	deliver := func(status int, retryAfter time.Duration) error {
		switch {
		case status == 429:
			return delayqueue.RetryIn(retryAfter, fmt.Errorf("webhook answered %d", status))
		case status >= 400 && status < 500:
			return fmt.Errorf("webhook answered %d: %w", status, delayqueue.ErrSkipRetry)
		case status >= 500:
			return fmt.Errorf("webhook answered %d", status) // the queue's backoff
		}
		return nil
	}
	for _, status := range []int{404, 429} {
		id, _ := q.Push(ctx, &delayqueue.Job{Topic: "webhook"})
		job, _ := q.Pop(ctx, "webhook", 0)
		_ = q.Retry(ctx, job, deliver(status, 30*time.Second)) // as Consume does with a handler's error
		got, _ := q.Get(ctx, id)
		fmt.Println(status, got.State, got.LastError)
	}
	// Output:
	// 404 dead webhook answered 404: delayqueue: skip retry
	// 429 delayed webhook answered 429
}

// A re-sent event must not change the job it created first.
func ExampleDelayQueue_Push_resent() {
	ctx := context.Background()
	srv, _ := miniredis.Run()
	defer srv.Close()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer client.Close()
	q, _ := delayqueue.New(client)
	defer q.Close(ctx)

	for _, body := range []string{"v1", "v2"} {
		id, _ := q.Push(ctx, &delayqueue.Job{ID: "event-7", Topic: "events", Body: []byte(body), Delay: time.Minute})
		fmt.Println(id)
	}
	job, _ := q.Get(ctx, "event-7")
	fmt.Println(string(job.Body))
	// Output:
	// event-7
	// event-7
	// v1
}

// An appointment moves: its reminder moves with it, in one call, whether it
// was still waiting, already due, or being sent.
func ExampleDelayQueue_Upsert() {
	ctx := context.Background()
	srv, _ := miniredis.Run()
	defer srv.Close()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer client.Close()
	q, _ := delayqueue.New(client)
	defer q.Close(ctx)

	remind := func(appointment string, at time.Time) error {
		_, err := q.Upsert(ctx, &delayqueue.Job{
			ID:    "reminder:" + appointment,
			Topic: "reminders",
			Body:  []byte(appointment + " at " + at.Format("15:04")),
			RunAt: at.Add(-10 * time.Minute),
		})
		return err
	}
	day := time.Date(2030, time.March, 4, 0, 0, 0, 0, time.UTC)
	_ = remind("dentist", day.Add(10*time.Hour))
	_ = remind("dentist", day.Add(11*time.Hour)) // moved
	job, _ := q.Get(ctx, "reminder:dentist")
	fmt.Println(job.State, string(job.Body))
	// Output:
	// delayed dentist at 11:00
}

// A handler that cannot work on a job yet puts it back without spending
// one of its attempts.
func ExampleSnooze() {
	ctx := context.Background()
	srv, _ := miniredis.Run()
	defer srv.Close()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer client.Close()
	q, _ := delayqueue.New(client)
	defer q.Close(ctx)

	id, _ := q.Push(ctx, &delayqueue.Job{Topic: "invoice", MaxAttempts: 1})
	job, _ := q.Pop(ctx, "invoice", 0)
	_ = q.Retry(ctx, job, delayqueue.Snooze(time.Minute)) // the report is not ready yet
	got, _ := q.Get(ctx, id)
	fmt.Println(got.State, "attempts:", got.Attempts)
	// Output:
	// delayed attempts: 0
}

func ExampleDelayQueue_RescheduleAt() {
	ctx := context.Background()
	srv, _ := miniredis.Run()
	defer srv.Close()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer client.Close()
	q, _ := delayqueue.New(client)
	defer q.Close(ctx)

	id, _ := q.Push(ctx, &delayqueue.Job{Topic: "remind", Delay: time.Hour})
	at := time.Date(2030, time.March, 4, 9, 50, 0, 0, time.UTC)
	_ = q.RescheduleAt(ctx, id, at)
	job, _ := q.Get(ctx, id)
	fmt.Println(job.State, job.RunAt.UTC().Format(time.RFC3339))
	_ = q.RescheduleIn(ctx, id, 0) // due now
	job, _ = q.Get(ctx, id)
	fmt.Println(job.State)
	// Output:
	// delayed 2030-03-04T09:50:00Z
	// ready
}

// Jobs pushed together; PushMany says of each whether it existed already.
func ExampleDelayQueue_PushMany() {
	ctx := context.Background()
	srv, _ := miniredis.Run()
	defer srv.Close()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer client.Close()
	q, _ := delayqueue.New(client)
	defer q.Close(ctx)

	_, _ = q.Push(ctx, &delayqueue.Job{ID: "invoice-1", Topic: "invoice", Delay: time.Hour})
	results, _ := q.PushMany(ctx, []*delayqueue.Job{
		{ID: "invoice-1", Topic: "invoice", Delay: time.Hour},
		{ID: "invoice-2", Topic: "invoice", Delay: time.Hour},
	})
	for _, r := range results {
		fmt.Println(r.ID, "existed:", r.Existed)
	}
	// Output:
	// invoice-1 existed: true
	// invoice-2 existed: false
}
