// Package dqprom shows a delayqueue to Prometheus: counters and histograms
// of what the queue does, fed by its Observer hook, and gauges of the jobs
// in Redis, read at each scrape. Nothing is registered globally: you
// register on the prometheus.Registerer of your choice.
//
//	m := dqprom.New(dqprom.Options{Queue: "orders"})
//	q, err := delayqueue.New(client, delayqueue.WithName("orders"), delayqueue.WithObserver(m))
//	reg.MustRegister(m, m.Gauges(q))
//
// # Metrics
//
// Each carries a topic label and, with Options.Queue, a queue label.
// Counters and histograms, of what this process saw:
//
//	delayqueue_jobs_pushed_total{existed}        pushes and upserts that stored a job; existed="true": its ID was taken
//	delayqueue_jobs_moved_total                  due jobs a bucket handler made ready
//	delayqueue_jobs_delivered_total              jobs reserved by Pop or Consume
//	delayqueue_jobs_finished_total               jobs finished
//	delayqueue_jobs_retried_total                jobs retried (a snooze is not a retry)
//	delayqueue_jobs_snoozed_total                jobs put back by Snooze
//	delayqueue_limit_waits_total                 waits of a consumer at its topic's limits
//	delayqueue_jobs_dead_total                   jobs sent to the dead letters
//	delayqueue_delivery_lateness_seconds         histogram: reservation start less due time, on the Redis server's clock
//	delayqueue_handler_duration_seconds{outcome} histogram: Consume handler run time; outcome "ok", "error" or "snooze"
//
// Gauges of the queue in Redis, read when scraped (Gauges):
//
//	delayqueue_jobs{state}                       jobs by state: delayed, ready, reserved, dead
//	delayqueue_oldest_ready_seconds              how long the oldest ready job has waited since it was due
//	delayqueue_paused                            1 while the topic is paused, else 0
//	delayqueue_limit{kind}                       a limited topic's limit: kind "concurrency" or "rate" (per its window)
//	delayqueue_limit_used{kind}                  how much of it is in use: grants held, reservations in the window
//	delayqueue_up                                1 when the last read of Redis succeeded, else 0 (no topic label)
//	delayqueue_overview_duration_seconds         how long that read took (no topic label)
//
// # Several processes
//
// The counters and histograms count what happened in this process: sum
// them over processes. The gauges are the queue's, the same whichever
// process reads them: register Gauges in one process per queue, or
// aggregate them with max, not sum.
//
// # Cost and limits
//
// Every topic is a label value, so each topic makes its own series (65
// with the default buckets, most of them histogram buckets): keep topics
// few and fixed, never one per user or order. Observing an event costs a
// few atomic operations and allocates nothing once its topic has been
// seen. A scrape of Gauges is one Overview call: a round trip per bucket,
// each O(topics) in Redis, bounded by Options.ScrapeTimeout.
package dqprom

import (
	"context"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultLatenessBuckets are the lateness histogram's upper bounds, in
// seconds: from 1 ms, the resolution of due times, to 10 s.
var DefaultLatenessBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// DefaultDurationBuckets are the handler duration histogram's upper bounds,
// in seconds: from 1 ms to 5 minutes, for handlers that call a service and
// for those that run a batch.
var DefaultDurationBuckets = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}

// Options shapes the metrics. The zero value is usable.
type Options struct {
	// Queue, when set, labels every metric queue=Queue. Set it to the
	// queue's name (delayqueue.WithName) when one process registers the
	// metrics of several queues on one registry, where they would
	// otherwise collide. Default: no queue label.
	Queue string
	// LatenessBuckets are the upper bounds, in seconds, of the buckets of
	// delayqueue_delivery_lateness_seconds. Default: DefaultLatenessBuckets.
	LatenessBuckets []float64
	// DurationBuckets are the upper bounds, in seconds, of the buckets of
	// delayqueue_handler_duration_seconds. Default: DefaultDurationBuckets.
	DurationBuckets []float64
	// ScrapeTimeout bounds how long a scrape of Gauges waits for Redis;
	// past it the scrape reports delayqueue_up 0 and no other gauge.
	// Default: 3s.
	ScrapeTimeout time.Duration
	// Logger receives the error of a scrape of Gauges that cannot read
	// Redis, at Warn. Default: slog.Default().
	Logger *slog.Logger
}

// defaultScrapeTimeout is Options.ScrapeTimeout's default.
const defaultScrapeTimeout = 3 * time.Second

// Metrics counts what a queue does: it is the delayqueue.Observer to set
// with delayqueue.WithObserver, and the prometheus.Collector of the
// counters and histograms to register. One Metrics may observe several
// queues, whose figures then add up. It is safe for concurrent use.
type Metrics struct {
	opts Options

	pushed, moved, delivered, finished, retried, dead *prometheus.CounterVec
	reserveCalls, ticks, missed, snoozed, limitWaits  *prometheus.CounterVec
	tickErrors                                        *prometheus.CounterVec
	lateness, duration                                *prometheus.HistogramVec

	// topics maps a topic to its series, so that an event looks its
	// series up without a lock or an allocation. It is replaced, never
	// changed: adding a topic copies it, under mu.
	topics atomic.Pointer[map[string]*topicSeries]
	mu     sync.Mutex
}

// topicSeries are one topic's series, taken from the vectors once.
type topicSeries struct {
	pushed, pushedExisted                prometheus.Counter
	moved, delivered, finished, retried  prometheus.Counter
	dead                                 prometheus.Counter
	callsFound, callsEmpty, callsTaken   prometheus.Counter
	lateness, durationOK, durationFailed prometheus.Observer
	snoozed, limitWaits                  prometheus.Counter
	durationSnoozed                      prometheus.Observer
}

// New makes the metrics. It panics, as the prometheus constructors do, on
// buckets that are not in increasing order and on a negative ScrapeTimeout.
func New(opts Options) *Metrics {
	if opts.LatenessBuckets == nil {
		opts.LatenessBuckets = DefaultLatenessBuckets
	}
	if opts.DurationBuckets == nil {
		opts.DurationBuckets = DefaultDurationBuckets
	}
	switch {
	case opts.ScrapeTimeout < 0:
		panic("dqprom: negative ScrapeTimeout")
	case opts.ScrapeTimeout == 0:
		opts.ScrapeTimeout = defaultScrapeTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	m := &Metrics{opts: opts}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: m.constLabels()},
			append([]string{"topic"}, labels...))
	}
	m.pushed = counter("delayqueue_jobs_pushed_total",
		`Pushes and upserts that stored a job; existed="true" when a job had its ID already.`, "existed")
	m.moved = counter("delayqueue_jobs_moved_total", "Due jobs that a bucket handler made ready.")
	m.delivered = counter("delayqueue_jobs_delivered_total", "Jobs reserved by Pop or Consume.")
	m.finished = counter("delayqueue_jobs_finished_total", "Jobs finished.")
	m.retried = counter("delayqueue_jobs_retried_total", "Jobs retried (not snoozed).")
	m.snoozed = counter("delayqueue_jobs_snoozed_total", "Jobs put back by Snooze, their attempts not counted.")
	m.limitWaits = counter("delayqueue_limit_waits_total", "Waits of a consumer at its topic's limits (SetLimits).")
	m.dead = counter("delayqueue_jobs_dead_total", "Jobs sent to the dead letters.")
	m.reserveCalls = counter("delayqueue_reserve_calls_total",
		`Reserve calls this process made; found="false" when one looked and reserved nothing (work for nothing), "taken" when one came only to claim signals and found other processes had taken them, or to look for a lost signal and found another process had looked in the last second (a few commands).`, "found")
	m.ticks = counter("delayqueue_schedule_ticks_total", "Ticks of schedules that came and were fired, by their job's topic.")
	m.missed = counter("delayqueue_schedule_ticks_missed_total",
		"Ticks of schedules skipped because no started process reached Redis at their time.")
	m.tickErrors = counter("delayqueue_schedule_tick_errors_total",
		"Looks at a schedule whose next tick could not be computed, by its job's topic: the schedule waits a minute and pushes nothing.")
	m.lateness = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:        "delayqueue_delivery_lateness_seconds",
		Help:        "How long after its due time a job was reserved, on the Redis server's clock.",
		ConstLabels: m.constLabels(), Buckets: opts.LatenessBuckets,
	}, []string{"topic"})
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:        "delayqueue_handler_duration_seconds",
		Help:        `How long a Consume handler ran on a job; outcome="error" when it returned an error or panicked, "snooze" when it snoozed the job.`,
		ConstLabels: m.constLabels(), Buckets: opts.DurationBuckets,
	}, []string{"topic", "outcome"})
	m.topics.Store(&map[string]*topicSeries{})
	return m
}

// constLabels are the labels every metric carries.
func (m *Metrics) constLabels() prometheus.Labels {
	if m.opts.Queue == "" {
		return nil
	}
	return prometheus.Labels{"queue": m.opts.Queue}
}

// Observe counts e. The queue calls it; it is cheap and never blocks.
func (m *Metrics) Observe(_ context.Context, e delayqueue.Event) {
	s := m.series(e.Topic)
	switch e.Kind {
	case delayqueue.EventPushed:
		if e.Existed {
			s.pushedExisted.Inc()
		} else {
			s.pushed.Inc()
		}
	case delayqueue.EventMoved:
		s.moved.Add(float64(e.Count))
	case delayqueue.EventReserved:
		s.delivered.Inc()
		if e.Lateness >= 0 { // negative: not known
			s.lateness.Observe(e.Lateness.Seconds())
		}
	case delayqueue.EventFinished:
		s.finished.Inc()
	case delayqueue.EventRetried:
		s.retried.Inc()
	case delayqueue.EventDead:
		s.dead.Inc()
	case delayqueue.EventReserveCall:
		switch {
		case e.Count > 0:
			s.callsFound.Inc()
		case e.Unclaimed:
			s.callsTaken.Inc()
		default:
			s.callsEmpty.Inc()
		}
	case delayqueue.EventTick: // rare: no cached series
		m.ticks.WithLabelValues(e.Topic).Add(float64(e.Count))
		m.missed.WithLabelValues(e.Topic).Add(float64(e.Missed))
	case delayqueue.EventTickFailed: // rare: no cached series
		m.tickErrors.WithLabelValues(e.Topic).Inc()
	case delayqueue.EventSnoozed:
		s.snoozed.Inc()
	case delayqueue.EventLimited:
		s.limitWaits.Inc()
	case delayqueue.EventHandled:
		switch {
		case e.Err == nil:
			s.durationOK.Observe(e.Duration.Seconds())
		case isSnooze(e.Err):
			s.durationSnoozed.Observe(e.Duration.Seconds())
		default:
			s.durationFailed.Observe(e.Duration.Seconds())
		}
	}
}

// series returns topic's series, making them at its first event.
func (m *Metrics) series(topic string) *topicSeries {
	if s, ok := (*m.topics.Load())[topic]; ok {
		return s
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old := *m.topics.Load()
	if s, ok := old[topic]; ok {
		return s
	}
	s := &topicSeries{
		pushed:         m.pushed.WithLabelValues(topic, "false"),
		pushedExisted:  m.pushed.WithLabelValues(topic, "true"),
		moved:          m.moved.WithLabelValues(topic),
		delivered:      m.delivered.WithLabelValues(topic),
		finished:       m.finished.WithLabelValues(topic),
		retried:        m.retried.WithLabelValues(topic),
		dead:           m.dead.WithLabelValues(topic),
		callsFound:     m.reserveCalls.WithLabelValues(topic, "true"),
		callsEmpty:     m.reserveCalls.WithLabelValues(topic, "false"),
		callsTaken:     m.reserveCalls.WithLabelValues(topic, "taken"),
		lateness:       m.lateness.WithLabelValues(topic),
		durationOK:     m.duration.WithLabelValues(topic, "ok"),
		durationFailed: m.duration.WithLabelValues(topic, "error"),

		snoozed:         m.snoozed.WithLabelValues(topic),
		limitWaits:      m.limitWaits.WithLabelValues(topic),
		durationSnoozed: m.duration.WithLabelValues(topic, "snooze"),
	}
	topics := make(map[string]*topicSeries, len(old)+1)
	maps.Copy(topics, old)
	topics[topic] = s
	m.topics.Store(&topics)
	return s
}

// collectors are the vectors, for Describe and Collect.
func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.pushed, m.moved, m.delivered, m.finished, m.retried, m.dead, m.reserveCalls, m.ticks, m.missed, m.tickErrors, m.snoozed, m.limitWaits, m.lateness, m.duration}
}

// Describe sends the descriptors of the counters and histograms.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect sends the counters and histograms of every topic seen so far.
// It does not talk to Redis.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

// isSnooze reports whether err is or wraps a delayqueue.SnoozeError, as
// errors.As would, without the allocation errors.As makes.
func isSnooze(err error) bool {
	for err != nil {
		if _, ok := err.(*delayqueue.SnoozeError); ok {
			return true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		err = u.Unwrap()
	}
	return false
}
