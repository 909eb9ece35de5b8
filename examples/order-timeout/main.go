// Command order-timeout cancels orders that are not paid in time: placing an
// order pushes a cancellation due at the deadline, with the order's ID as the
// job's ID; paying removes it. A worker cancels whatever is left. A dedup
// window keeps a retried push (the API's first attempt got no reply) from
// bringing back a cancellation that payment removed.
//
//	go run ./examples/order-timeout
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/examples/internal/exampleredis"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "order-timeout:", err)
		os.Exit(1)
	}
}

const payWithin = 2 * time.Second

func run(ctx context.Context) error {
	// exampleredis lives inside this repository, so that the example runs
	// anywhere (a real Redis at $REDIS_ADDR, else an embedded miniredis). In
	// your code: client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	client, closeClient, err := exampleredis.Client()
	if err != nil {
		return err
	}
	defer closeClient()
	// For an hour after a cancellation was removed or done, pushing its ID
	// again creates nothing.
	q, err := delayqueue.New(client, delayqueue.WithName("shop"), delayqueue.WithDedupWindow(time.Hour))
	if err != nil {
		return err
	}
	defer q.Close(context.WithoutCancel(ctx))
	if err := q.Start(ctx); err != nil {
		return err
	}

	orders := []string{"order-1001", "order-1002", "order-1003", "order-1004", "order-1005"}
	paid := map[string]bool{"order-1002": true, "order-1004": true}

	// Placing an order: schedule its cancellation. Pushing twice (a retried
	// request) schedules it once, because the order ID is the job ID.
	for _, order := range orders {
		for range 2 {
			if _, err := q.Push(ctx, &delayqueue.Job{ID: "cancel-" + order, Topic: "order.cancel", Body: []byte(order), Delay: payWithin}); err != nil {
				return err
			}
		}
		fmt.Printf("placed %s: cancelled in %v unless paid\n", order, payWithin)
	}

	// Paying: the cancellation is removed.
	time.Sleep(payWithin / 2) // customers take their time
	for order := range paid {
		if err := q.Remove(ctx, "cancel-"+order); err != nil {
			return err
		}
		fmt.Printf("paid   %s: cancellation removed\n", order)
	}

	// A placement request retried late, after the payment: the dedup
	// window answers it as a duplicate, and the paid order stays.
	for order := range paid {
		if _, err := q.Push(ctx, &delayqueue.Job{ID: "cancel-" + order, Topic: "order.cancel", Body: []byte(order), Delay: payWithin}); err != nil {
			return err
		}
		if _, err := q.Get(ctx, "cancel-"+order); !errors.Is(err, delayqueue.ErrNotFound) {
			return fmt.Errorf("the cancellation of paid %s came back: %v", order, err)
		}
		fmt.Printf("retry  %s: placement pushed again, no cancellation comes back\n", order)
	}

	// The worker: cancel what is still unpaid when its deadline comes.
	ctx, stopWorker := context.WithCancel(ctx)
	var mu sync.Mutex
	cancelled := 0
	err = q.Consume(ctx, "order.cancel", func(ctx context.Context, job *delayqueue.Job) error {
		fmt.Printf("cancel %s: not paid within %v\n", job.Body, payWithin)
		mu.Lock()
		defer mu.Unlock()
		if cancelled++; cancelled == len(orders)-len(paid) {
			stopWorker()
		}
		return nil
	}, delayqueue.ConsumeOptions{Concurrency: 4})
	if err != nil {
		return err
	}
	fmt.Printf("%d orders cancelled, %d paid\n", cancelled, len(paid))
	return nil
}
