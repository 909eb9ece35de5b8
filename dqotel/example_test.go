package dqotel_test

import (
	"context"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/dqotel"
	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func Example() {
	ctx := context.Background()
	srv, _ := miniredis.Run()
	defer srv.Close()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer client.Close()
	spans := tracetest.NewInMemoryExporter() // your exporter here
	tracers := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tracers.Shutdown(ctx)

	tel, err := dqotel.New(dqotel.WithTracerProvider(tracers)) // default: the global providers
	if err != nil {
		panic(err)
	}
	q, err := delayqueue.New(client, append(tel.Options(), delayqueue.WithName("orders"))...)
	if err != nil {
		panic(err)
	}
	defer q.Close(ctx)

	if _, err := q.Push(ctx, &delayqueue.Job{Topic: "order.cancel", Body: []byte(`{"order":42}`)}); err != nil {
		panic(err)
	}
	cctx, stop := context.WithCancel(ctx)
	_ = q.Consume(cctx, "order.cancel", func(ctx context.Context, job *delayqueue.Job) error {
		stop() // one job is enough here
		return nil
	}, delayqueue.ConsumeOptions{})

	got := spans.GetSpans()
	send, process := got[0], got[1]
	fmt.Println(send.Name, send.SpanKind)
	fmt.Println(process.Name, process.SpanKind)
	fmt.Println("linked:", process.Links[0].SpanContext.SpanID() == send.SpanContext.SpanID())
	// Output:
	// send order.cancel producer
	// process order.cancel consumer
	// linked: true
}
