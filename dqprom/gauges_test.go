package dqprom_test

import (
	"context"
	"errors"
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

// fakeQueue is an Overviewer that answers what it is told.
type fakeQueue struct {
	ov    delayqueue.Overview
	err   error
	block bool       // wait for the context to end, as a dead Redis makes a call do
	ended chan error // with block: the context's error, once it ended
}

func (f *fakeQueue) Overview(ctx context.Context) (delayqueue.Overview, error) {
	if f.block {
		<-ctx.Done()
		f.ended <- ctx.Err()
		return delayqueue.Overview{}, ctx.Err()
	}
	return f.ov, f.err
}

func TestGaugesReportEachTopicByStateAndThePausedOnes(t *testing.T) {
	q := &fakeQueue{ov: delayqueue.Overview{
		Topics: map[string]delayqueue.Counts{
			"mail": {Delayed: 3, Ready: 2, Reserved: 1, Dead: 4, OldestReady: 1500 * time.Millisecond},
			"sms":  {Ready: 0},
		},
		Paused: []string{"idle", "sms"}, // idle has no job
		Limits: map[string]delayqueue.LimitUsage{"sms": {
			Limits:  delayqueue.Limits{Concurrency: 5, Rate: 20, Per: time.Second},
			Running: 2, InWindow: 7,
		}},
	}}
	m := dqprom.New(dqprom.Options{Queue: "orders"})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m.Gauges(q))
	got := scrape(t, reg)
	assertFigures(t, got, []figure{
		{"delayqueue_jobs", []string{"topic", "mail", "state", "delayed"}, 3},
		{"delayqueue_jobs", []string{"topic", "mail", "state", "ready"}, 2},
		{"delayqueue_jobs", []string{"topic", "mail", "state", "reserved"}, 1},
		{"delayqueue_jobs", []string{"topic", "mail", "state", "dead"}, 4},
		{"delayqueue_jobs", []string{"topic", "sms", "state", "ready"}, 0},
		{"delayqueue_jobs", []string{"topic", "idle", "state", "ready"}, 0},
		{"delayqueue_oldest_ready_seconds", []string{"topic", "mail"}, 1.5},
		{"delayqueue_oldest_ready_seconds", []string{"topic", "sms"}, 0},
		{"delayqueue_paused", []string{"topic", "mail"}, 0},
		{"delayqueue_paused", []string{"topic", "sms"}, 1},
		{"delayqueue_paused", []string{"topic", "idle"}, 1},
		{"delayqueue_limit", []string{"topic", "sms", "kind", "concurrency"}, 5},
		{"delayqueue_limit", []string{"topic", "sms", "kind", "rate"}, 20},
		{"delayqueue_limit_used", []string{"topic", "sms", "kind", "concurrency"}, 2},
		{"delayqueue_limit_used", []string{"topic", "sms", "kind", "rate"}, 7},
		{"delayqueue_up", nil, 1},
	}, "queue", "orders")
	assert.GreaterOrEqual(t, value(t, got, "delayqueue_overview_duration_seconds"), 0.0)
	assert.Len(t, got["delayqueue_jobs"].GetMetric(), 12, "three topics, four states")

	// The jobs of mail are all gone, and nothing is paused any more: the
	// topics of the scrape before report zeros, not nothing.
	q.ov = delayqueue.Overview{Topics: map[string]delayqueue.Counts{}}
	got = scrape(t, reg)
	assertFigures(t, got, []figure{
		{"delayqueue_jobs", []string{"topic", "mail", "state", "delayed"}, 0},
		{"delayqueue_jobs", []string{"topic", "idle", "state", "dead"}, 0},
		{"delayqueue_oldest_ready_seconds", []string{"topic", "mail"}, 0},
		{"delayqueue_paused", []string{"topic", "sms"}, 0},
	}, "queue", "orders")
}

// TestGaugesCoverTheTopicsOfEvents: a topic this process pushed to reads
// zero at the first scrape after its jobs are gone, not nothing.
func TestGaugesCoverTheTopicsOfEvents(t *testing.T) {
	m := dqprom.New(dqprom.Options{})
	m.Observe(context.Background(), delayqueue.Event{Kind: delayqueue.EventFinished, Topic: "done"})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m, m.Gauges(&fakeQueue{ov: delayqueue.Overview{}}))
	assertFigures(t, scrape(t, reg), []figure{
		{"delayqueue_jobs", []string{"topic", "done", "state", "ready"}, 0},
		{"delayqueue_oldest_ready_seconds", []string{"topic", "done"}, 0},
		{"delayqueue_paused", []string{"topic", "done"}, 0},
	})
}

// TestGaugesOfAnUnreachableQueueSayDownAndTheScrapeGoesOn: a failed read
// is delayqueue_up 0, and the counters beside it are still scraped.
func TestGaugesOfAnUnreachableQueueSayDownAndTheScrapeGoesOn(t *testing.T) {
	m := dqprom.New(dqprom.Options{Logger: discard})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m, m.Gauges(&fakeQueue{err: errors.New("connection refused")}))
	m.Observe(context.Background(), delayqueue.Event{Kind: delayqueue.EventPushed, Topic: "t"})
	got := scrape(t, reg) // fails the test on an HTTP error
	assert.Equal(t, 0.0, value(t, got, "delayqueue_up"))
	assert.NotContains(t, got, "delayqueue_jobs")
	assert.Equal(t, 1.0, value(t, got, "delayqueue_jobs_pushed_total", "topic", "t", "existed", "false"))
}

// TestGaugesGiveUpAtTheScrapeTimeout: a read that would hang (a dead
// Redis) ends at ScrapeTimeout.
func TestGaugesGiveUpAtTheScrapeTimeout(t *testing.T) {
	q := &fakeQueue{block: true, ended: make(chan error, 1)}
	m := dqprom.New(dqprom.Options{ScrapeTimeout: 20 * time.Millisecond, Logger: discard})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m.Gauges(q))
	got := scrape(t, reg)
	assert.ErrorIs(t, <-q.ended, context.DeadlineExceeded)
	assert.Equal(t, 0.0, value(t, got, "delayqueue_up"))
}

// TestGaugesReadARealQueue reads the gauges of a queue in Redis, through
// delayqueue's own Overview.
func TestGaugesReadARealQueue(t *testing.T) {
	redistest.ForEach(t, func(t *testing.T, client redis.UniversalClient) {
		ctx := context.Background()
		q, err := delayqueue.New(client, delayqueue.WithName(queueName()), delayqueue.WithLogger(discard))
		require.NoError(t, err)
		defer func() { require.NoError(t, q.Close(ctx)) }()
		for range 2 {
			_, err := q.Push(ctx, &delayqueue.Job{Topic: "mail", Delay: time.Hour})
			require.NoError(t, err)
		}
		for range 3 {
			_, err := q.Push(ctx, &delayqueue.Job{Topic: "mail"})
			require.NoError(t, err)
		}
		_, err = q.Pop(ctx, "mail", 0)
		require.NoError(t, err)
		_, err = q.Push(ctx, &delayqueue.Job{Topic: "sms", MaxAttempts: 1})
		require.NoError(t, err)
		job, err := q.Pop(ctx, "sms", 0)
		require.NoError(t, err)
		require.NoError(t, q.Retry(ctx, job, errors.New("bounced")))
		require.NoError(t, q.Pause(ctx, "mail"))

		m := dqprom.New(dqprom.Options{})
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(m.Gauges(q))
		got := scrape(t, reg)
		assertFigures(t, got, []figure{
			{"delayqueue_jobs", []string{"topic", "mail", "state", "delayed"}, 2},
			{"delayqueue_jobs", []string{"topic", "mail", "state", "ready"}, 2},
			{"delayqueue_jobs", []string{"topic", "mail", "state", "reserved"}, 1},
			{"delayqueue_jobs", []string{"topic", "mail", "state", "dead"}, 0},
			{"delayqueue_jobs", []string{"topic", "sms", "state", "dead"}, 1},
			{"delayqueue_jobs", []string{"topic", "sms", "state", "ready"}, 0},
			{"delayqueue_paused", []string{"topic", "mail"}, 1},
			{"delayqueue_paused", []string{"topic", "sms"}, 0},
			{"delayqueue_oldest_ready_seconds", []string{"topic", "sms"}, 0},
			{"delayqueue_up", nil, 1},
		})
		assert.GreaterOrEqual(t, value(t, got, "delayqueue_oldest_ready_seconds", "topic", "mail"), 0.0)
	})
}
