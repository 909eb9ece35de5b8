package dqotel_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/dqotel"
	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

func TestMain(m *testing.M) {
	os.Exit(redistest.Run(m))
}

var (
	nameSeq   atomic.Int64
	nameChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)
	discard   = slog.New(slog.NewTextHandler(io.Discard, nil))
)

// uniqueName gives each test its own queue on a shared Redis.
func uniqueName(t *testing.T) string {
	n := nameChars.ReplaceAllString(t.Name(), "_")
	if len(n) > 40 {
		n = n[len(n)-40:]
	}
	return fmt.Sprintf("%s.%d", n, nameSeq.Add(1))
}

// openQueue opens the queue named name, closed when the test ends.
func openQueue(t *testing.T, c redis.UniversalClient, name string, opts ...delayqueue.Option) *delayqueue.DelayQueue {
	t.Helper()
	q, err := delayqueue.New(c, append([]delayqueue.Option{delayqueue.WithName(name), delayqueue.WithLogger(discard)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, q.Close(ctx))
	})
	return q
}

// process is the telemetry of one process: an SDK TracerProvider whose
// spans end up in memory, and a MeterProvider read by hand.
type process struct {
	*dqotel.Telemetry
	tracers *sdktrace.TracerProvider
	spans   *tracetest.InMemoryExporter
	metrics *sdkmetric.ManualReader
}

func newProcess(t *testing.T, opts ...dqotel.Option) *process {
	spans := tracetest.NewInMemoryExporter()
	tracers := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	metrics := sdkmetric.NewManualReader()
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(metrics))
	t.Cleanup(func() {
		assert.NoError(t, tracers.Shutdown(context.Background()))
		assert.NoError(t, meters.Shutdown(context.Background()))
	})
	tel, err := dqotel.New(append([]dqotel.Option{dqotel.WithTracerProvider(tracers), dqotel.WithMeterProvider(meters)}, opts...)...)
	require.NoError(t, err)
	return &process{Telemetry: tel, tracers: tracers, spans: spans, metrics: metrics}
}

// spansNamed returns the ended spans of that name, oldest first.
func (p *process) spansNamed(name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range p.spans.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// span returns the one ended span of that name.
func (p *process) span(t *testing.T, name string) tracetest.SpanStub {
	t.Helper()
	spans := p.spansNamed(name)
	require.Len(t, spans, 1, "spans named %q", name)
	return spans[0]
}

// counts returns, by their attributes, the values of a counter's data
// points, or the counts of a histogram's.
func (p *process) counts(t *testing.T, name string) map[attribute.Distinct]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, p.metrics.Collect(context.Background(), &rm))
	out := map[attribute.Distinct]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					out[dp.Attributes.Equivalent()] = dp.Value
				}
			case metricdata.Histogram[float64]:
				for _, dp := range data.DataPoints {
					out[dp.Attributes.Equivalent()] = int64(dp.Count)
				}
			}
		}
	}
	return out
}

// set is the attribute set of a metric data point.
func set(kv ...attribute.KeyValue) attribute.Distinct {
	s := attribute.NewSet(kv...)
	return s.Equivalent()
}

var (
	system    = attribute.String("messaging.system", "delayqueue")
	orders    = attribute.String("messaging.destination.name", "orders")
	sendOp    = attribute.String("messaging.operation.name", "send")
	receiveOp = attribute.String("messaging.operation.name", "receive")
	processOp = attribute.String("messaging.operation.name", "process")
)

func errorType(v string) attribute.KeyValue { return attribute.String("error.type", v) }

// consume runs Consume on topic "orders" until n handler calls returned,
// then stops it and waits until it returned: every process span has ended.
func consume(t *testing.T, q *delayqueue.DelayQueue, n int, h delayqueue.Handler) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var calls atomic.Int64
	done := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- q.Consume(ctx, "orders", func(ctx context.Context, job *delayqueue.Job) error {
			defer func() {
				if calls.Add(1) == int64(n) {
					close(done)
				}
			}()
			return h(ctx, job)
		}, delayqueue.ConsumeOptions{})
	}()
	select {
	case <-done:
	case err := <-errc:
		t.Fatalf("Consume returned early: %v", err)
	}
	cancel()
	require.NoError(t, <-errc)
}

// TestTheProcessSpanLinksToTheSendSpanOfAnotherProcess pushes from a
// producer that never starts and consumes in another process (another
// queue on the same Redis, with telemetry of its own), and follows the
// trace context from one to the other.
func TestTheProcessSpanLinksToTheSendSpanOfAnotherProcess(t *testing.T) {
	redistest.ForEach(t, func(t *testing.T, c redis.UniversalClient) {
		name := uniqueName(t)
		producer, consumer := newProcess(t), newProcess(t)
		pq := openQueue(t, c, name, producer.Options()...)
		cq := openQueue(t, c, name, consumer.Options()...)
		require.NoError(t, cq.Start(context.Background()))

		// The push happens in a request's span.
		ctx, request := producer.tracers.Tracer("test").Start(context.Background(), "request")
		job := &delayqueue.Job{Topic: "orders", Body: []byte("42")}
		id, err := pq.Push(ctx, job)
		require.NoError(t, err)
		request.End()
		assert.Contains(t, job.Headers, "traceparent", "the Job pushed carries its trace context")

		var handled trace.SpanContext
		var headers map[string]string
		consume(t, cq, 1, func(ctx context.Context, job *delayqueue.Job) error {
			handled, headers = trace.SpanContextFromContext(ctx), job.Headers
			return nil
		})

		sent := producer.span(t, "send orders")
		assert.Equal(t, trace.SpanKindProducer, sent.SpanKind)
		assert.Equal(t, request.SpanContext().SpanID(), sent.Parent.SpanID(), "a child of the caller's span")
		assert.Equal(t, codes.Unset, sent.Status.Code)
		assert.ElementsMatch(t, []attribute.KeyValue{system, orders, sendOp,
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.message.id", id)}, sent.Attributes)
		assert.Equal(t, fmt.Sprintf("00-%s-%s-01", sent.SpanContext.TraceID(), sent.SpanContext.SpanID()),
			headers["traceparent"], "the job carries the send span's context")

		processed := consumer.span(t, "process orders")
		assert.Equal(t, trace.SpanKindConsumer, processed.SpanKind)
		assert.False(t, processed.Parent.IsValid(), "a root span: the handler's context holds none")
		require.Len(t, processed.Links, 1)
		link := processed.Links[0].SpanContext
		assert.Equal(t, sent.SpanContext.TraceID(), link.TraceID(), "linked to the producer's trace")
		assert.Equal(t, sent.SpanContext.SpanID(), link.SpanID(), "linked to the send span")
		assert.True(t, link.IsRemote())
		assert.Equal(t, processed.SpanContext, handled, "the handler runs in the process span")
		assert.Equal(t, codes.Unset, processed.Status.Code)
		assert.ElementsMatch(t, []attribute.KeyValue{system, orders, processOp,
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.message.id", id),
			attribute.Int("messaging.delayqueue.message.delivery_attempt", 1)}, processed.Attributes)

		assert.Equal(t, int64(1), producer.counts(t, "messaging.client.sent.messages")[set(system, sendOp, orders)])
		assert.Empty(t, producer.counts(t, "messaging.client.consumed.messages"), "the producer consumed nothing")
		assert.Equal(t, int64(1), consumer.counts(t, "messaging.client.consumed.messages")[set(system, receiveOp, orders)])
		assert.Equal(t, int64(1), consumer.counts(t, "messaging.process.duration")[set(system, processOp, orders)])
		assert.Equal(t, int64(1), consumer.counts(t, "messaging.delayqueue.lateness")[set(system, receiveOp, orders)])
	})
}

func TestWithProducerAsParentTheProcessSpanIsTheSendSpansChild(t *testing.T) {
	redistest.ForEach(t, func(t *testing.T, c redis.UniversalClient) {
		name := uniqueName(t)
		producer, consumer := newProcess(t), newProcess(t, dqotel.WithProducerAsParent())
		pq := openQueue(t, c, name, producer.Options()...)
		cq := openQueue(t, c, name, consumer.Options()...)
		_, err := pq.Push(context.Background(), &delayqueue.Job{Topic: "orders"})
		require.NoError(t, err)
		consume(t, cq, 1, func(context.Context, *delayqueue.Job) error { return nil })

		sent := producer.span(t, "send orders")
		processed := consumer.span(t, "process orders")
		assert.Equal(t, sent.SpanContext.TraceID(), processed.SpanContext.TraceID(), "one trace")
		assert.Equal(t, sent.SpanContext.SpanID(), processed.Parent.SpanID())
		require.Len(t, processed.Links, 1)
		assert.Equal(t, sent.SpanContext.SpanID(), processed.Links[0].SpanContext.SpanID(), "and the link, still")
	})
}

func TestTheProcessSpanSaysHowTheHandlerFailed(t *testing.T) {
	redistest.ForEach(t, func(t *testing.T, c redis.UniversalClient) {
		tel := newProcess(t)
		q := openQueue(t, c, uniqueName(t), append(tel.Options(), delayqueue.WithMaxAttempts(1))...)
		outcomes := map[string]func() error{
			"fails":   func() error { return errors.New("boom") },
			"skips":   func() error { return fmt.Errorf("gone: %w", delayqueue.ErrSkipRetry) },
			"retries": func() error { return delayqueue.RetryIn(time.Hour, fmt.Errorf("busy: %w", io.ErrUnexpectedEOF)) },
			"panics":  func() error { panic("oops") },
			"snoozes": func() error { return delayqueue.Snooze(time.Hour) },
			"works":   func() error { return nil },
		}
		for id := range outcomes {
			_, err := q.Push(context.Background(), &delayqueue.Job{ID: id, Topic: "orders"})
			require.NoError(t, err)
		}
		consume(t, q, len(outcomes), func(_ context.Context, job *delayqueue.Job) error {
			return outcomes[job.ID]()
		})

		byID := map[string]tracetest.SpanStub{}
		for _, s := range tel.spansNamed("process orders") {
			for _, kv := range s.Attributes {
				if kv.Key == "messaging.message.id" {
					byID[kv.Value.AsString()] = s
				}
			}
		}
		require.Len(t, byID, len(outcomes))
		for id, want := range map[string]struct {
			kind, text string
		}{
			"fails":   {"*errors.errorString", "boom"},
			"skips":   {"delayqueue.ErrSkipRetry", "gone: delayqueue: skip retry"},
			"retries": {"*errors.errorString", "delayqueue: retry in 1h0m0s: busy: unexpected EOF"},
			"panics":  {"panic", "oops"},
			"snoozes": {},
			"works":   {},
		} {
			s := byID[id]
			if want.kind == "" {
				assert.Equal(t, codes.Unset, s.Status.Code, id)
				assert.NotContains(t, s.Attributes, errorType(""), id)
				continue
			}
			assert.Equal(t, sdktrace.Status{Code: codes.Error, Description: want.text}, s.Status, id)
			assert.Contains(t, s.Attributes, errorType(want.kind), id)
		}
		durations := tel.counts(t, "messaging.process.duration")
		assert.Equal(t, int64(2), durations[set(system, processOp, orders)], "works, snoozes")
		assert.Equal(t, int64(2), durations[set(system, processOp, orders, errorType("*errors.errorString"))])
		assert.Equal(t, int64(1), durations[set(system, processOp, orders, errorType("panic"))])
		assert.Equal(t, int64(1), durations[set(system, processOp, orders, errorType("delayqueue.ErrSkipRetry"))])
	})
}

func TestTheSendSpanSaysHowThePushFailed(t *testing.T) {
	redistest.ForEach(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		tel := newProcess(t)
		q := openQueue(t, c, uniqueName(t), tel.Options()...)
		_, err := q.Push(ctx, &delayqueue.Job{ID: "held", Topic: "orders"})
		require.NoError(t, err)
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		_, err = q.Upsert(cancelled, &delayqueue.Job{ID: "held", Topic: "orders"})
		require.ErrorIs(t, err, context.Canceled)

		spans := tel.spansNamed("send orders")
		require.Len(t, spans, 2)
		assert.Equal(t, codes.Unset, spans[0].Status.Code)
		assert.Equal(t, codes.Error, spans[1].Status.Code)
		assert.Equal(t, err.Error(), spans[1].Status.Description)
		assert.Contains(t, spans[1].Attributes, errorType("context.Canceled"))
		sent := tel.counts(t, "messaging.client.sent.messages")
		assert.Equal(t, int64(1), sent[set(system, sendOp, orders)])
		assert.Equal(t, int64(1), sent[set(system, sendOp, orders, errorType("context.Canceled"))])
	})
}

func TestPushManyMakesASendSpanPerJob(t *testing.T) {
	redistest.ForEach(t, func(t *testing.T, c redis.UniversalClient) {
		tel := newProcess(t)
		q := openQueue(t, c, uniqueName(t), tel.Options()...)
		shared := map[string]string{"tenant": "acme"} // one map for all: each job gets its own copy
		jobs := []*delayqueue.Job{
			{Topic: "orders", Headers: shared}, {Topic: "orders", Headers: shared}, {Topic: "orders", Headers: shared},
		}
		ids, err := q.PushMany(context.Background(), jobs)
		require.NoError(t, err)
		assert.Equal(t, map[string]string{"tenant": "acme"}, shared, "the caller's map is left alone")

		spans := tel.spansNamed("send orders")
		require.Len(t, spans, len(jobs))
		seen := map[trace.SpanID]bool{}
		for i, s := range spans {
			assert.Contains(t, s.Attributes, attribute.String("messaging.message.id", ids[i].ID))
			got, err := q.Get(context.Background(), ids[i].ID)
			require.NoError(t, err)
			assert.Equal(t, fmt.Sprintf("00-%s-%s-01", s.SpanContext.TraceID(), s.SpanContext.SpanID()),
				got.Headers["traceparent"], "each job carries its own send span")
			assert.Equal(t, "acme", got.Headers["tenant"])
			seen[s.SpanContext.SpanID()] = true
		}
		assert.Len(t, seen, len(jobs))
		assert.Equal(t, int64(len(jobs)), tel.counts(t, "messaging.client.sent.messages")[set(system, sendOp, orders)])
	})
}

// TestAJobPushedWithoutATraceContextCostsNothing pushes the same job from
// a queue without dqotel, from one whose tracing is off, and from one that
// traces, and compares what each stored.
func TestAJobPushedWithoutATraceContextCostsNothing(t *testing.T) {
	redistest.ForEach(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		name := uniqueName(t)
		off, err := dqotel.New(dqotel.WithTracerProvider(noop.NewTracerProvider()))
		require.NoError(t, err)
		plain := openQueue(t, c, name)
		untraced := openQueue(t, c, name, off.Options()...)
		traced := openQueue(t, c, name, newProcess(t).Options()...)

		pool := poolKey(t, c, name, plain)
		size := func(id string) int64 {
			n, err := c.HStrLen(ctx, pool, id).Result()
			require.NoError(t, err)
			return n
		}
		for id, q := range map[string]*delayqueue.DelayQueue{"plain": plain, "untraced": untraced, "traced": traced} {
			_, err := q.Push(ctx, &delayqueue.Job{ID: id, Topic: "orders", Body: []byte("body"), Delay: time.Hour})
			require.NoError(t, err)
		}
		const header = 22 // the encoding's fixed header
		assert.Equal(t, int64(header+len("orders")+len("body")), size("plain"))
		assert.Equal(t, size("plain"), size("untraced"), "tracing that is off costs no byte")
		for _, id := range []string{"plain", "untraced"} {
			job, err := plain.Get(ctx, id)
			require.NoError(t, err)
			assert.Nil(t, job.Headers, id)
		}
		assert.Equal(t, size("plain")+70, size("traced"), "a W3C trace context takes 70 bytes")
	})
}

// poolKey finds the pool hash of the queue name: it has one bucket here.
func poolKey(t *testing.T, c redis.UniversalClient, name string, q *delayqueue.DelayQueue) string {
	t.Helper()
	_, err := q.Push(context.Background(), &delayqueue.Job{ID: "probe", Topic: "probe", Delay: time.Hour})
	require.NoError(t, err)
	keys, err := c.Keys(context.Background(), "dq:{"+name+":*}:pool").Result()
	require.NoError(t, err)
	require.Len(t, keys, 1)
	return keys[0]
}

func TestTheHandlerGetsTheBaggageTheJobCarries(t *testing.T) {
	redistest.ForEach(t, func(t *testing.T, c redis.UniversalClient) {
		both := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
		tel := newProcess(t, dqotel.WithPropagator(both))
		q := openQueue(t, c, uniqueName(t), tel.Options()...)
		member, err := baggage.NewMember("tenant", "acme")
		require.NoError(t, err)
		bag, err := baggage.New(member)
		require.NoError(t, err)
		_, err = q.Push(baggage.ContextWithBaggage(context.Background(), bag), &delayqueue.Job{Topic: "orders"})
		require.NoError(t, err)
		var got string
		consume(t, q, 1, func(ctx context.Context, _ *delayqueue.Job) error {
			got = baggage.FromContext(ctx).Member("tenant").Value()
			return nil
		})
		assert.Equal(t, "acme", got)
	})
}
