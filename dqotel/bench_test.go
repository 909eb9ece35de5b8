package dqotel_test

import (
	"context"
	"testing"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/dqotel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// benchTelemetry is dqotel on SDK providers that record every span and
// metric and export nothing: the cost of the hooks themselves.
func benchTelemetry(b *testing.B) *dqotel.Telemetry {
	tp := sdktrace.NewTracerProvider()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	tel, err := dqotel.New(dqotel.WithTracerProvider(tp), dqotel.WithMeterProvider(mp))
	if err != nil {
		b.Fatal(err)
	}
	return tel
}

// BenchmarkSend is the push middleware's cost per job: a send span, the
// trace context written into the job's Headers, a counter.
func BenchmarkSend(b *testing.B) {
	push := benchTelemetry(b).PushMiddleware(func(context.Context, []*delayqueue.Job) error { return nil })
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		job := &delayqueue.Job{ID: "~abc", Topic: "t"}
		if err := push(ctx, []*delayqueue.Job{job}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkProcess is the consume middleware's cost per handled job: the
// trace context read from the job, a process span linked to it, a
// duration recorded.
func BenchmarkProcess(b *testing.B) {
	tel := benchTelemetry(b)
	ctx := context.Background()
	job := &delayqueue.Job{ID: "~abc", Topic: "t", Attempts: 1}
	if err := tel.PushMiddleware(func(context.Context, []*delayqueue.Job) error { return nil })(ctx, []*delayqueue.Job{job}); err != nil {
		b.Fatal(err)
	}
	handle := tel.ConsumeMiddleware(func(context.Context, *delayqueue.Job) error { return nil })
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if err := handle(ctx, job); err != nil {
			b.Fatal(err)
		}
	}
}
