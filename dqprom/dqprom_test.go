package dqprom_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/dqprom"
	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestScrapeCountsAKnownSequenceOfOperations runs a queue through pushes,
// moves, pops, finishes, a retry, a death and a Consume with a failing
// handler, and reads every figure back through promhttp.
func TestScrapeCountsAKnownSequenceOfOperations(t *testing.T) {
	redistest.ForEach(t, func(t *testing.T, client redis.UniversalClient) {
		ctx := context.Background()
		m := dqprom.New(dqprom.Options{Queue: "mailer"})
		q, err := delayqueue.New(client, delayqueue.WithName(queueName()), delayqueue.WithObserver(m),
			delayqueue.WithLogger(discard), delayqueue.WithBackoff(delayqueue.BackoffSchedule()))
		require.NoError(t, err)
		defer func() { require.NoError(t, q.Close(ctx)) }()
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(m, m.Gauges(q))

		push := func(job *delayqueue.Job) {
			t.Helper()
			_, err := q.Push(ctx, job)
			require.NoError(t, err)
		}
		pop := func(topic string) *delayqueue.Job {
			t.Helper()
			job, err := q.Pop(ctx, topic, 0)
			require.NoError(t, err)
			return job
		}
		// Three mails due now, two in 20ms (moved once Start is called), one
		// pushed again, and a text message with a single attempt.
		for _, id := range []string{"a", "b", "c"} {
			push(&delayqueue.Job{ID: id, Topic: "mail"})
		}
		for _, id := range []string{"d", "e"} {
			push(&delayqueue.Job{ID: id, Topic: "mail", Delay: 20 * time.Millisecond})
		}
		push(&delayqueue.Job{ID: "a", Topic: "mail"})
		push(&delayqueue.Job{ID: "x", Topic: "sms", MaxAttempts: 1})

		// Pop the three ready mails: finish two, retry one (ready again at
		// once). The text message fails its one attempt: dead.
		require.NoError(t, q.Finish(ctx, pop("mail").ID))
		require.NoError(t, q.Finish(ctx, pop("mail").ID))
		require.NoError(t, q.Retry(ctx, pop("mail"), errors.New("greylisted")))
		require.NoError(t, q.Retry(ctx, pop("sms"), errors.New("bounced")))

		// Consume the retried mail and the two moved ones; d's handler
		// fails once, e's snoozes once.
		require.NoError(t, q.Start(ctx))
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		consumed := make(chan error, 1)
		var snoozed atomic.Bool
		go func() {
			consumed <- q.Consume(cctx, "mail", func(_ context.Context, job *delayqueue.Job) error {
				if job.ID == "d" && job.Attempts == 1 {
					return errors.New("smtp down")
				}
				if job.ID == "e" && snoozed.CompareAndSwap(false, true) {
					return delayqueue.Snooze(0)
				}
				return nil
			}, delayqueue.ConsumeOptions{})
		}()
		require.Eventually(t, func() bool {
			return value(t, gather(reg), "delayqueue_jobs_finished_total", "topic", "mail") == 5
		}, time.Minute, 10*time.Millisecond)
		cancel()
		require.NoError(t, <-consumed)

		got := scrape(t, reg)
		assertFigures(t, got, []figure{
			{"delayqueue_jobs_pushed_total", []string{"topic", "mail", "existed", "false"}, 5},
			{"delayqueue_jobs_pushed_total", []string{"topic", "mail", "existed", "true"}, 1},
			{"delayqueue_jobs_pushed_total", []string{"topic", "sms", "existed", "false"}, 1},
			{"delayqueue_jobs_moved_total", []string{"topic", "mail"}, 2},
			{"delayqueue_jobs_delivered_total", []string{"topic", "mail"}, 8}, // a b c, then c d d e e
			{"delayqueue_jobs_delivered_total", []string{"topic", "sms"}, 1},
			{"delayqueue_jobs_finished_total", []string{"topic", "mail"}, 5},
			{"delayqueue_jobs_finished_total", []string{"topic", "sms"}, 0},
			{"delayqueue_jobs_retried_total", []string{"topic", "mail"}, 2}, // c by Retry, d by its handler
			{"delayqueue_jobs_snoozed_total", []string{"topic", "mail"}, 1},
			{"delayqueue_jobs_dead_total", []string{"topic", "sms"}, 1},
			{"delayqueue_jobs_dead_total", []string{"topic", "mail"}, 0},
			{"delayqueue_delivery_lateness_seconds", []string{"topic", "mail"}, 8},
			{"delayqueue_delivery_lateness_seconds", []string{"topic", "sms"}, 1},
			{"delayqueue_handler_duration_seconds", []string{"topic", "mail", "outcome", "ok"}, 3},
			{"delayqueue_handler_duration_seconds", []string{"topic", "mail", "outcome", "error"}, 1},
			{"delayqueue_handler_duration_seconds", []string{"topic", "mail", "outcome", "snooze"}, 1},
			{"delayqueue_up", nil, 1},
		}, "queue", "mailer")
		for _, m := range got["delayqueue_delivery_lateness_seconds"].GetMetric() {
			assert.GreaterOrEqual(t, m.GetHistogram().GetSampleSum(), 0.0, "never early")
		}
	})
}

// TestObserveAllocatesNothingForAKnownTopic: the queue calls Observe on
// its hot paths.
func TestObserveAllocatesNothingForAKnownTopic(t *testing.T) {
	m := dqprom.New(dqprom.Options{})
	ctx := context.Background()
	failed := errors.New("failed")
	events := []delayqueue.Event{
		{Kind: delayqueue.EventPushed, Topic: "t"},
		{Kind: delayqueue.EventPushed, Topic: "t", Existed: true},
		{Kind: delayqueue.EventMoved, Topic: "t", Count: 3},
		{Kind: delayqueue.EventReserved, Topic: "t", Lateness: 3 * time.Millisecond},
		{Kind: delayqueue.EventReserved, Topic: "t", Lateness: -1},
		{Kind: delayqueue.EventFinished, Topic: "t"},
		{Kind: delayqueue.EventRetried, Topic: "t", Err: failed},
		{Kind: delayqueue.EventDead, Topic: "t", Err: failed},
		{Kind: delayqueue.EventHandled, Topic: "t", Duration: time.Millisecond},
		{Kind: delayqueue.EventHandled, Topic: "t", Duration: time.Millisecond, Err: failed},
		{Kind: delayqueue.EventSnoozed, Topic: "t"},
		{Kind: delayqueue.EventLimited, Topic: "t"},
	}
	m.Observe(ctx, events[0]) // the topic's first event makes its series
	allocs := testing.AllocsPerRun(100, func() {
		for _, e := range events {
			m.Observe(ctx, e)
		}
	})
	assert.Zero(t, allocs)
}

// TestLatenessOfUnknownDueTimeIsNotObserved: a delivery counts, but its
// lateness of -1 (unknown) stays out of the histogram.
func TestLatenessOfUnknownDueTimeIsNotObserved(t *testing.T) {
	m := dqprom.New(dqprom.Options{})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	ctx := context.Background()
	m.Observe(ctx, delayqueue.Event{Kind: delayqueue.EventReserved, Topic: "t", Lateness: -1})
	m.Observe(ctx, delayqueue.Event{Kind: delayqueue.EventReserved, Topic: "t", Lateness: 0})
	m.Observe(ctx, delayqueue.Event{Kind: delayqueue.EventReserved, Topic: "t", Lateness: 30 * time.Millisecond})
	got := scrape(t, reg)
	assert.Equal(t, 3.0, value(t, got, "delayqueue_jobs_delivered_total", "topic", "t"))
	h := got["delayqueue_delivery_lateness_seconds"].GetMetric()[0].GetHistogram()
	assert.Equal(t, uint64(2), h.GetSampleCount())
	assert.InDelta(t, 0.030, h.GetSampleSum(), 1e-9)
	for _, b := range h.GetBucket() {
		switch b.GetUpperBound() {
		case .001, .025:
			assert.Equal(t, uint64(1), b.GetCumulativeCount(), "le=%g", b.GetUpperBound())
		case .05:
			assert.Equal(t, uint64(2), b.GetCumulativeCount(), "le=%g", b.GetUpperBound())
		}
	}
}

// TestTwoQueuesInOneRegistryNeedTheirQueueLabels: without Options.Queue
// two queues' metrics collide; with it they register side by side.
func TestTwoQueuesInOneRegistryNeedTheirQueueLabels(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	a, b := dqprom.New(dqprom.Options{Queue: "a"}), dqprom.New(dqprom.Options{Queue: "b"})
	require.NoError(t, reg.Register(a))
	require.NoError(t, reg.Register(b))
	require.Error(t, reg.Register(dqprom.New(dqprom.Options{Queue: "a"})))
	ctx := context.Background()
	a.Observe(ctx, delayqueue.Event{Kind: delayqueue.EventFinished, Topic: "t"})
	got := scrape(t, reg)
	assert.Equal(t, 1.0, value(t, got, "delayqueue_jobs_finished_total", "queue", "a"))
	assert.Equal(t, -1.0, value(t, got, "delayqueue_jobs_finished_total", "queue", "b"), "no topic seen yet")
}

func BenchmarkObserve(b *testing.B) {
	m := dqprom.New(dqprom.Options{})
	ctx := context.Background()
	e := delayqueue.Event{Kind: delayqueue.EventReserved, Topic: "t", Lateness: 3 * time.Millisecond}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Observe(ctx, e)
		}
	})
}

func TestScheduleTicksFiredAndMissedAreCounted(t *testing.T) {
	m := dqprom.New(dqprom.Options{})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	ctx := context.Background()
	m.Observe(ctx, delayqueue.Event{Kind: delayqueue.EventTick, Topic: "t", Schedule: "s", Count: 1})
	m.Observe(ctx, delayqueue.Event{Kind: delayqueue.EventTick, Topic: "t", Schedule: "s", Count: 1, Missed: 59})
	got := scrape(t, reg)
	assert.Equal(t, 2.0, value(t, got, "delayqueue_schedule_ticks_total", "topic", "t"))
	assert.Equal(t, 59.0, value(t, got, "delayqueue_schedule_ticks_missed_total", "topic", "t"))

	m.Observe(ctx, delayqueue.Event{Kind: delayqueue.EventTickFailed, Topic: "t", Schedule: "s", Err: errors.New("no zone")})
	got = scrape(t, reg)
	assert.Equal(t, 1.0, value(t, got, "delayqueue_schedule_tick_errors_total", "topic", "t"))
	assert.Equal(t, 2.0, value(t, got, "delayqueue_schedule_ticks_total", "topic", "t"), "a failed tick is no tick")
}

// A reserve call that came only to claim signals and found them taken is
// counted apart from one that looked and found nothing: the one costs
// Redis a few commands, the other a look at the list.
func TestReserveCallsAreCountedByWhatTheyFound(t *testing.T) {
	m := dqprom.New(dqprom.Options{})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	ctx := context.Background()
	m.Observe(ctx, delayqueue.Event{Kind: delayqueue.EventReserveCall, Topic: "t", Count: 3})
	m.Observe(ctx, delayqueue.Event{Kind: delayqueue.EventReserveCall, Topic: "t"})
	m.Observe(ctx, delayqueue.Event{Kind: delayqueue.EventReserveCall, Topic: "t", Unclaimed: true})
	m.Observe(ctx, delayqueue.Event{Kind: delayqueue.EventReserveCall, Topic: "t", Unclaimed: true})
	got := scrape(t, reg)
	assert.Equal(t, 1.0, value(t, got, "delayqueue_reserve_calls_total", "topic", "t", "found", "true"))
	assert.Equal(t, 1.0, value(t, got, "delayqueue_reserve_calls_total", "topic", "t", "found", "false"))
	assert.Equal(t, 2.0, value(t, got, "delayqueue_reserve_calls_total", "topic", "t", "found", "taken"))
}
