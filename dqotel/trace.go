package dqotel

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dqueue/delayqueue"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.30.0"
	"go.opentelemetry.io/otel/trace"
)

// PushMiddleware traces every push of a queue it wraps
// (delayqueue.WithPushMiddleware): a send span per job, whose context it
// writes into a copy of the job's Headers, ended with the push's outcome;
// and it counts the jobs in messaging.client.sent.messages. The push runs
// in the context of its send span when it pushes one job, so that a traced
// Redis client's spans fall under it.
func (t *Telemetry) PushMiddleware(next delayqueue.PushFunc) delayqueue.PushFunc {
	return func(ctx context.Context, jobs []*delayqueue.Job) error {
		start := time.Now()
		spans := make([]trace.Span, len(jobs))
		ids := make([]string, len(jobs))
		for i, job := range jobs {
			_, spans[i] = t.tracer.Start(ctx, "send "+job.Topic,
				trace.WithSpanKind(trace.SpanKindProducer),
				trace.WithTimestamp(start),
				trace.WithAttributes(systemAttr, sendName, semconv.MessagingOperationTypeSend,
					semconv.MessagingDestinationName(job.Topic), semconv.MessagingMessageID(job.ID)))
			ids[i] = job.ID
			t.inject(trace.ContextWithSpan(ctx, spans[i]), job)
		}
		pushCtx := ctx
		if len(spans) == 1 {
			pushCtx = trace.ContextWithSpan(ctx, spans[0])
		}
		err := next(pushCtx, jobs)
		end := time.Now()
		for i, span := range spans {
			job := jobs[i]
			if job.ID != ids[i] { // a generated ID found taken was replaced
				span.SetAttributes(semconv.MessagingMessageID(job.ID))
			}
			attrs := []attribute.KeyValue{systemAttr, sendName, semconv.MessagingDestinationName(job.Topic)}
			attrs = endSpan(span, end, err, attrs)
			t.sent.Add(ctx, 1, metric.WithAttributes(attrs...))
		}
		return err
	}
}

// inject writes the trace context of ctx into a copy of job's Headers. A
// job stays without headers when there is nothing to write.
func (t *Telemetry) inject(ctx context.Context, job *delayqueue.Job) {
	h := make(map[string]string, len(job.Headers)+1)
	for k, v := range job.Headers {
		h[k] = v
	}
	t.propagator.Inject(ctx, propagation.MapCarrier(h))
	if len(h) > 0 {
		job.Headers = h
	}
}

// ConsumeMiddleware traces every handler of a queue it wraps
// (delayqueue.WithConsumeMiddleware): a process span around each call,
// linked to the send span whose context the job carries (and its child,
// with WithProducerAsParent), ended with the handler's outcome; and it
// records the call's duration in messaging.process.duration. The handler
// runs in the context of its process span, with the baggage the job
// carries when the propagator reads baggage. A panic is recorded and goes
// on.
func (t *Telemetry) ConsumeMiddleware(next delayqueue.Handler) delayqueue.Handler {
	return func(ctx context.Context, job *delayqueue.Job) (err error) {
		start := time.Now()
		opts := []trace.SpanStartOption{
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithTimestamp(start),
			trace.WithAttributes(systemAttr, processName, semconv.MessagingOperationTypeProcess,
				semconv.MessagingDestinationName(job.Topic), semconv.MessagingMessageID(job.ID),
				attemptKey.Int(job.Attempts)),
		}
		parent := ctx
		if len(job.Headers) > 0 {
			carried := t.propagator.Extract(context.Background(), propagation.MapCarrier(job.Headers))
			if created := trace.SpanContextFromContext(carried); created.IsValid() {
				opts = append(opts, trace.WithLinks(trace.Link{SpanContext: created}))
				if t.asParent {
					if ambient := trace.SpanContextFromContext(ctx); ambient.IsValid() {
						opts = append(opts, trace.WithLinks(trace.Link{SpanContext: ambient}))
					}
					parent = trace.ContextWithRemoteSpanContext(ctx, created)
				}
			}
			if bag := baggage.FromContext(carried); bag.Len() > 0 {
				parent = baggage.ContextWithBaggage(parent, bag)
			}
		}
		ctx, span := t.tracer.Start(parent, "process "+job.Topic, opts...)
		defer func() {
			r := recover()
			failure := err
			if r != nil {
				failure = panicked{r}
			}
			end := time.Now()
			attrs := []attribute.KeyValue{systemAttr, processName, semconv.MessagingDestinationName(job.Topic)}
			attrs = endSpan(span, end, failure, attrs)
			t.processDuration.Record(ctx, end.Sub(start).Seconds(), metric.WithAttributes(attrs...))
			if r != nil {
				panic(r)
			}
		}()
		return next(ctx, job)
	}
}

// panicked is a handler's panic, as the span records it.
type panicked struct{ value any }

func (p panicked) Error() string { return fmt.Sprint(p.value) }

// endSpan ends span at end. When err is a failure it sets the span's status
// and error.type, and returns attrs with error.type added.
func endSpan(span trace.Span, end time.Time, err error, attrs []attribute.KeyValue) []attribute.KeyValue {
	var snoozed *delayqueue.SnoozeError
	if err != nil && !errors.As(err, &snoozed) {
		kind := semconv.ErrorTypeKey.String(errorType(err))
		span.SetAttributes(kind)
		span.SetStatus(codes.Error, err.Error())
		attrs = append(attrs, kind)
	}
	span.End(trace.WithTimestamp(end))
	return attrs
}

// namedErrors are the errors that error.type names, first match first:
// the queue's sentinels that a push or a handler meets, and the context's.
var namedErrors = []struct {
	err  error
	name string
}{
	{delayqueue.ErrSkipRetry, "delayqueue.ErrSkipRetry"},
	{delayqueue.ErrNotPending, "delayqueue.ErrNotPending"},
	{delayqueue.ErrReservationLost, "delayqueue.ErrReservationLost"},
	{delayqueue.ErrNotFound, "delayqueue.ErrNotFound"},
	{delayqueue.ErrInvalidJob, "delayqueue.ErrInvalidJob"},
	{delayqueue.ErrClosed, "delayqueue.ErrClosed"},
	{context.DeadlineExceeded, "context.DeadlineExceeded"},
	{context.Canceled, "context.Canceled"},
}

// errorType is the value of error.type for err: few values, as the
// conventions ask. A panic is "panic"; an error that matches one of
// namedErrors is its name; any other is the Go type of what fmt.Errorf's
// %w (or RetryIn) wraps, such as "*net.OpError".
func errorType(err error) string {
	if _, ok := err.(panicked); ok {
		return "panic"
	}
	for _, n := range namedErrors {
		if errors.Is(err, n.err) {
			return n.name
		}
	}
	for {
		_, retry := err.(*delayqueue.RetryInError)
		inner := errors.Unwrap(err)
		if inner == nil || !retry && fmt.Sprintf("%T", err) != "*fmt.wrapError" {
			return fmt.Sprintf("%T", err)
		}
		err = inner
	}
}

// Observe counts the jobs reserved by Pop or Consume in
// messaging.client.consumed.messages, and records how late each was in
// messaging.delayqueue.lateness; it ignores the other events.
func (t *Telemetry) Observe(ctx context.Context, e delayqueue.Event) {
	if e.Kind != delayqueue.EventReserved {
		return
	}
	attrs := metric.WithAttributes(systemAttr, receiveName, semconv.MessagingDestinationName(e.Topic))
	t.consumed.Add(ctx, 1, attrs)
	if e.Lateness >= 0 {
		t.lateness.Record(ctx, e.Lateness.Seconds(), attrs)
	}
}
