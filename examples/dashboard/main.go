// Command dashboard serves the delay queue's dashboard in a plain net/http
// server, under /admin/queue/, on top of a running queue with some jobs in
// every state, until Ctrl-C.
//
//	go run ./examples/dashboard                       # on an embedded miniredis
//	REDIS_ADDR=127.0.0.1:6379 go run ./examples/dashboard -listen 127.0.0.1:8080
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/dashboard"
	"github.com/dqueue/delayqueue/examples/internal/exampleredis"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "address to serve the dashboard on")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	err := run(ctx, *listen, func(url string) { fmt.Println("dashboard at", url, "(Ctrl-C to stop)") })
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
}

// run serves the dashboard on listen until ctx ends; started gets its URL
// once it listens.
func run(ctx context.Context, listen string, started func(url string)) error {
	client, closeClient, err := exampleredis.Client()
	if err != nil {
		return err
	}
	defer closeClient()
	q, err := delayqueue.New(client, delayqueue.WithName("dashboard-demo"))
	if err != nil {
		return err
	}
	defer q.Close(context.WithoutCancel(ctx))
	if err := q.Start(ctx); err != nil { // and keeps the history the charts show
		return err
	}
	if err := demo(ctx, q); err != nil {
		return err
	}

	mux := http.NewServeMux()
	// Mount it behind your service's own authentication; ReadOnly: true
	// for a page that may only look.
	mux.Handle("/admin/queue/", http.StripPrefix("/admin/queue", dashboard.New(q, dashboard.Options{})))
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	started("http://" + ln.Addr().String() + "/admin/queue/")

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// demo pushes jobs in every state: delayed, ready, reserved (popped and
// held), dead (failed), and a paused topic; and keeps "email" busy with a
// worker while ctx lasts, for the charts.
func demo(ctx context.Context, q *delayqueue.DelayQueue) error {
	jobs := []*delayqueue.Job{
		{Topic: "report", Body: []byte("will fail"), MaxAttempts: 1},
		{Topic: "report", Body: []byte("in hand"), TTR: time.Hour},
		{Topic: "report", Body: []byte(`{"month":"2024-05"}`)},
		{Topic: "report", Body: []byte("<script>alert(1)</script>"), Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
		{Topic: "report", Body: []byte{0x1f, 0x8b, 0x08, 0x00, 0xde, 0xad}},
		{Topic: "report", Body: []byte("next week"), Delay: 7 * 24 * time.Hour},
		{Topic: "billing/eu", Body: []byte("invoice 17"), Delay: time.Hour},
	}
	for i, j := range jobs {
		if _, err := q.Push(ctx, j); err != nil {
			return err
		}
		if i < 2 { // the first fails and dies, the second stays reserved
			job, err := q.Pop(ctx, "report", time.Second)
			if err != nil {
				return err
			}
			if i == 0 {
				if err := q.Retry(ctx, job, errors.New("smtp: 550 mailbox unavailable")); err != nil {
					return err
				}
			}
		}
	}
	if err := q.Pause(ctx, "billing/eu"); err != nil {
		return err
	}
	go func() {
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_, _ = q.Push(ctx, &delayqueue.Job{Topic: "email", Body: fmt.Appendf(nil, "welcome #%d", n), Delay: time.Duration(n%5) * time.Second})
			}
		}
	}()
	go func() {
		_ = q.Consume(ctx, "email", func(ctx context.Context, job *delayqueue.Job) error { return nil }, delayqueue.ConsumeOptions{})
	}()
	return nil
}
