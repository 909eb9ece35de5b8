// Package dqotel traces and measures a delayqueue with OpenTelemetry, by
// the messaging semantic conventions (v1.30.0): a "send <topic>" span of
// kind PRODUCER for every pushed job, whose trace context travels inside
// the job (Job.Headers), and a "process <topic>" span of kind CONSUMER
// around every Consume handler, linked to the send span of its job.
//
//	tel, err := dqotel.New() // the global TracerProvider and MeterProvider
//	q, err := delayqueue.New(client, tel.Options()...)
//
// Producers and consumers each plug it into their own queue: a process
// that only pushes gets send spans, one that consumes gets process spans
// linked to the producer's, across processes.
//
// # Spans
//
// A send span starts in the context given to the push (a child of the
// caller's span), once the job passed the queue's checks and has its ID, and
// ends with the push's outcome; PushMany makes one per job. Its context is
// injected into the job's Headers (by W3C Trace Context unless
// WithPropagator says otherwise), in a copy of the map: it adds 70 bytes to
// the stored job with W3C Trace Context. A job pushed with no trace context
// to carry (a no-op TracerProvider and no span in the push's context) gets
// no headers, and costs no byte for them.
//
// A process span covers one call of the handler. As the conventions
// recommend, it links to its job's send span (the message's creation
// context) and is a child of the handler's own context, a root span when
// that holds none; WithProducerAsParent makes it a child of the send span
// instead, with the same link. Pop has no span: its caller decides what
// processing is.
//
// Both carry messaging.system ("delayqueue": no well-known value names
// this queue, and "redis" would say Redis's own pub/sub or streams),
// messaging.destination.name (the topic), messaging.message.id (the job's
// ID), messaging.operation.name and messaging.operation.type ("send" or
// "process"); a process span also carries
// messaging.delayqueue.message.delivery_attempt (Job.Attempts: 1 on the
// first delivery). When the push or the handler fails, the span's status
// is Error, with the error's text, and error.type says what failed, with
// few values: the name of the queue's error it matches (such as
// "delayqueue.ErrNotPending" or "delayqueue.ErrSkipRetry"),
// "context.DeadlineExceeded" or "context.Canceled", "panic" for a
// handler's panic (which goes on to Consume, which retries the job), and
// otherwise the Go type of the error that fmt.Errorf's %w or RetryIn
// wraps, such as "*net.OpError". A handler's Snooze is no failure.
//
// # Metrics
//
//   - messaging.client.sent.messages (counter): jobs pushed, by the push
//     middleware, so that a failed push counts with its error.type.
//   - messaging.client.consumed.messages (counter): jobs delivered to a
//     consumer, by Pop or Consume: the Observer's EventReserved.
//   - messaging.process.duration (histogram, s): each handler call, as
//     long as its process span.
//   - messaging.delayqueue.lateness (histogram, s): how long after its due
//     time each job was reserved, on the Redis server's clock: the
//     Observer's EventReserved.
//
// Each carries messaging.system, messaging.operation.name ("send",
// "receive" or "process") and messaging.destination.name, and error.type
// when the operation failed. Topics are attribute values: keep their
// number bounded.
package dqotel

import (
	"github.com/dqueue/delayqueue"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.30.0"
	"go.opentelemetry.io/otel/trace"
)

// scope names the instrumentation: this package.
const scope = "github.com/dqueue/delayqueue/dqotel"

// System is the value of messaging.system on every span and metric.
const System = "delayqueue"

// Telemetry traces and measures the queues it is plugged into (Options).
// It is safe for concurrent use, and one Telemetry may serve many queues.
type Telemetry struct {
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	asParent   bool

	sent            metric.Int64Counter
	consumed        metric.Int64Counter
	processDuration metric.Float64Histogram
	lateness        metric.Float64Histogram
}

// Option configures a Telemetry in New. Only this package creates options:
// use the With functions.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	tracers    trace.TracerProvider
	meters     metric.MeterProvider
	propagator propagation.TextMapPropagator
	asParent   bool
}

// WithTracerProvider sets where spans go. Default (and for nil): the
// global TracerProvider (otel.GetTracerProvider), as it is when New is
// called; one set globally later is used too, as the global one forwards
// to it.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.tracers = tp })
}

// WithMeterProvider sets where metrics go. Default (and for nil): the
// global MeterProvider (otel.GetMeterProvider), which forwards as the
// global TracerProvider does.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) { c.meters = mp })
}

// WithPropagator sets how a trace context is written into a job's Headers
// and read back. Default (and for nil): W3C Trace Context
// (propagation.TraceContext). Producers and consumers must agree; pass
// otel.GetTextMapPropagator() to use the global one.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return optionFunc(func(c *config) { c.propagator = p })
}

// WithProducerAsParent makes each process span a child of its job's send
// span, besides linking to it, so that producer and consumer share one
// trace; a span already in the handler's context is then linked too.
// Default: the process span links to the send span and is a child of the
// handler's context, as the messaging conventions recommend: a job may
// wait hours, and a trace that spans them is hard to read.
func WithProducerAsParent() Option {
	return optionFunc(func(c *config) { c.asParent = true })
}

// Buckets of the duration histograms, in seconds: the conventions' advice
// for process.duration, and for lateness, from a millisecond to a minute.
var (
	durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
	latenessBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
)

// New makes a Telemetry. It returns an error when the MeterProvider refuses
// an instrument.
func New(opts ...Option) (*Telemetry, error) {
	var c config
	for _, opt := range opts {
		if opt != nil {
			opt.apply(&c)
		}
	}
	if c.tracers == nil {
		c.tracers = otel.GetTracerProvider()
	}
	if c.meters == nil {
		c.meters = otel.GetMeterProvider()
	}
	if c.propagator == nil {
		c.propagator = propagation.TraceContext{}
	}
	t := &Telemetry{
		tracer:     c.tracers.Tracer(scope, trace.WithSchemaURL(semconv.SchemaURL)),
		propagator: c.propagator,
		asParent:   c.asParent,
	}
	meter := c.meters.Meter(scope, metric.WithSchemaURL(semconv.SchemaURL))
	var err error
	if t.sent, err = meter.Int64Counter(semconv.MessagingClientSentMessagesName,
		metric.WithUnit(semconv.MessagingClientSentMessagesUnit),
		metric.WithDescription(semconv.MessagingClientSentMessagesDescription)); err != nil {
		return nil, err
	}
	if t.consumed, err = meter.Int64Counter(semconv.MessagingClientConsumedMessagesName,
		metric.WithUnit(semconv.MessagingClientConsumedMessagesUnit),
		metric.WithDescription(semconv.MessagingClientConsumedMessagesDescription)); err != nil {
		return nil, err
	}
	if t.processDuration, err = meter.Float64Histogram(semconv.MessagingProcessDurationName,
		metric.WithUnit(semconv.MessagingProcessDurationUnit),
		metric.WithDescription(semconv.MessagingProcessDurationDescription),
		metric.WithExplicitBucketBoundaries(durationBuckets...)); err != nil {
		return nil, err
	}
	if t.lateness, err = meter.Float64Histogram("messaging.delayqueue.lateness",
		metric.WithUnit("s"),
		metric.WithDescription("How long after its due time a job was reserved, on the Redis server's clock."),
		metric.WithExplicitBucketBoundaries(latenessBuckets...)); err != nil {
		return nil, err
	}
	return t, nil
}

// Options are the queue options that plug t into a queue: its push
// middleware, its consume middleware and its Observer.
//
//	q, err := delayqueue.New(client, tel.Options()...)
func (t *Telemetry) Options() []delayqueue.Option {
	return []delayqueue.Option{
		delayqueue.WithPushMiddleware(t.PushMiddleware),
		delayqueue.WithConsumeMiddleware(t.ConsumeMiddleware),
		delayqueue.WithObserver(t),
	}
}

// The attributes every span and metric of an operation carries.
var (
	systemAttr  = semconv.MessagingSystemKey.String(System)
	sendName    = semconv.MessagingOperationName("send")
	receiveName = semconv.MessagingOperationName("receive")
	processName = semconv.MessagingOperationName("process")
	attemptKey  = attribute.Key("messaging.delayqueue.message.delivery_attempt")
)
