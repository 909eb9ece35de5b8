package dqprom

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/prometheus/client_golang/prometheus"
)

// An Overviewer reads a queue's figures at one moment; a
// *delayqueue.DelayQueue is one.
type Overviewer interface {
	Overview(ctx context.Context) (delayqueue.Overview, error)
}

// Gauges returns the collector of q's gauges, read from Redis at each
// scrape with one q.Overview call bounded by Options.ScrapeTimeout (see the
// package doc for the metrics). A scrape that cannot read Redis reports
// delayqueue_up 0 and no other gauge, and logs the error. A topic with no
// jobs reports zeros once a scrape or an event of m's saw it. The collector
// is safe for concurrent use; register it in one process per queue, once
// per registry (two queues need two Metrics with different Options.Queue).
func (m *Metrics) Gauges(q Overviewer) prometheus.Collector {
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, m.constLabels())
	}
	return &gauges{
		q: q, opts: &m.opts, events: m,
		jobs:   desc("delayqueue_jobs", "Jobs in the queue by topic and state (delayed, ready, reserved, dead).", "topic", "state"),
		oldest: desc("delayqueue_oldest_ready_seconds", "How long the topic's oldest ready job has waited since it was due; 0 when none is ready.", "topic"),
		paused: desc("delayqueue_paused", "1 while the topic is paused, else 0.", "topic"),
		up:     desc("delayqueue_up", "1 when the last scrape read the queue from Redis, 0 when it could not."),
		took:   desc("delayqueue_overview_duration_seconds", "How long the last scrape took to read the queue from Redis."),
		limit: desc("delayqueue_limit", `A limited topic's limit (SetLimits): kind="concurrency" jobs reserved at once, "rate" jobs reserved per window.`,
			"topic", "kind"),
		limitUsed: desc("delayqueue_limit_used", `How much of a limited topic's limit is in use: kind="concurrency" grants held, "rate" reservations in the window.`,
			"topic", "kind"),
	}
}

// gauges is the collector Gauges returns.
type gauges struct {
	q                              Overviewer
	opts                           *Options
	jobs, oldest, paused, up, took *prometheus.Desc
	limit, limitUsed               *prometheus.Desc

	events *Metrics // its topics report zeros too

	mu   sync.Mutex
	seen map[string]bool // topics of earlier scrapes: they report zeros, not nothing, once their jobs are gone
}

// Describe sends the gauges' descriptors.
func (g *gauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{g.jobs, g.oldest, g.paused, g.up, g.took, g.limit, g.limitUsed} {
		ch <- d
	}
}

// Collect reads the queue and sends its gauges.
func (g *gauges) Collect(ch chan<- prometheus.Metric) {
	// A scrape carries no context: the timeout is the bound.
	ctx, cancel := context.WithTimeout(context.Background(), g.opts.ScrapeTimeout)
	defer cancel()
	start := time.Now()
	ov, err := g.q.Overview(ctx)
	ch <- prometheus.MustNewConstMetric(g.took, prometheus.GaugeValue, time.Since(start).Seconds())
	if err != nil {
		g.opts.Logger.Warn("dqprom: scrape cannot read the queue", "error", err)
		ch <- prometheus.MustNewConstMetric(g.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(g.up, prometheus.GaugeValue, 1)
	for topic, u := range ov.Limits {
		for _, k := range []struct {
			kind        string
			limit, used int
		}{{"concurrency", u.Concurrency, u.Running}, {"rate", u.Rate, u.InWindow}} {
			if k.limit > 0 {
				ch <- prometheus.MustNewConstMetric(g.limit, prometheus.GaugeValue, float64(k.limit), topic, k.kind)
				ch <- prometheus.MustNewConstMetric(g.limitUsed, prometheus.GaugeValue, float64(k.used), topic, k.kind)
			}
		}
	}
	if ov.Topics == nil {
		ov.Topics = map[string]delayqueue.Counts{}
	}
	g.mu.Lock()
	if g.seen == nil {
		g.seen = map[string]bool{}
	}
	for topic := range ov.Topics {
		g.seen[topic] = true
	}
	for _, topic := range ov.Paused {
		g.seen[topic] = true
	}
	for topic := range *g.events.topics.Load() {
		g.seen[topic] = true
	}
	for topic := range g.seen {
		if _, ok := ov.Topics[topic]; !ok {
			ov.Topics[topic] = delayqueue.Counts{}
		}
	}
	g.mu.Unlock()
	for topic, c := range ov.Topics {
		for _, s := range []struct {
			state string
			n     int
		}{{"delayed", c.Delayed}, {"ready", c.Ready}, {"reserved", c.Reserved}, {"dead", c.Dead}} {
			ch <- prometheus.MustNewConstMetric(g.jobs, prometheus.GaugeValue, float64(s.n), topic, s.state)
		}
		ch <- prometheus.MustNewConstMetric(g.oldest, prometheus.GaugeValue, c.OldestReady.Seconds(), topic)
		paused := 0.0
		if slices.Contains(ov.Paused, topic) {
			paused = 1
		}
		ch <- prometheus.MustNewConstMetric(g.paused, prometheus.GaugeValue, paused, topic)
	}
}
