package dashboard

import (
	"bytes"
	"context"
	"html/template"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/internal/svgchart"
)

// The overview's charts: the queue's figures over the last minutes, as
// sampled each time the overview reads them anew (its auto-refresh shows
// it every few seconds), kept in a ring in memory. No goroutine samples in
// the background: a dashboard nobody looks at costs nothing.

const (
	// keepSamples bounds the ring: at one sample per samplesEvery, 20
	// minutes.
	keepSamples  = 240
	samplesEvery = 5 * time.Second
)

// Meter counts the jobs a queue finishes and the jobs that die, for the
// overview's throughput chart: give it to the queue with
// delayqueue.WithObserver, and to the dashboard in Options.Meter. It only
// sees what the process it lives in does. It is safe for concurrent use.
type Meter struct {
	finished, dead atomic.Int64
}

// NewMeter returns a Meter at zero.
func NewMeter() *Meter { return &Meter{} }

// Observe counts finished and dead jobs.
func (m *Meter) Observe(_ context.Context, e delayqueue.Event) {
	switch e.Kind {
	case delayqueue.EventFinished:
		m.finished.Add(1)
	case delayqueue.EventDead:
		m.dead.Add(1)
	}
}

// sample is the queue's figures at one moment.
type sample struct {
	at             time.Time
	total          delayqueue.Counts
	finished, dead int64
}

// history is the ring of samples.
type history struct {
	meter   *Meter
	mu      sync.Mutex
	samples []sample // oldest first
}

func newHistory(m *Meter) *history { return &history{meter: m} }

// add keeps ov's figures, unless the last sample is under samplesEvery
// old (then it replaces it).
func (h *history) add(ov delayqueue.Overview) {
	s := sample{at: time.Now(), total: ov.Total}
	if h.meter != nil {
		s.finished, s.dead = h.meter.finished.Load(), h.meter.dead.Load()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(h.samples)
	switch {
	case n >= 2 && s.at.Sub(h.samples[n-2].at) < samplesEvery:
		h.samples[n-1] = s
	case n == keepSamples:
		h.samples = append(h.samples[1:], s)
	default:
		h.samples = append(h.samples, s)
	}
}

// charts draws the samples, once there are two. Their SVG is made by
// internal/svgchart from numbers and this file's own titles: no topic,
// ID or body goes into it.
func (h *history) charts() []template.HTML {
	h.mu.Lock()
	samples := append([]sample(nil), h.samples...)
	h.mu.Unlock()
	if len(samples) < 2 {
		return nil
	}
	last := samples[len(samples)-1].at
	x := func(s sample) float64 { return -last.Sub(s.at).Seconds() }
	counts := []svgchart.Series{
		{Name: "ready", Color: svgchart.Colors[0]},
		{Name: "delayed", Color: svgchart.Colors[1]},
		{Name: "reserved", Color: svgchart.Colors[2]},
		{Name: "dead", Color: svgchart.Colors[3]},
	}
	late := []svgchart.Series{{Name: "oldest ready", Color: svgchart.Colors[0]}}
	rate := []svgchart.Series{{Name: "finished", Color: svgchart.Colors[2]}, {Name: "dead", Color: svgchart.Colors[3]}}
	for i, s := range samples {
		for j, v := range []int{s.total.Ready, s.total.Delayed, s.total.Reserved, s.total.Dead} {
			counts[j].Points = append(counts[j].Points, [2]float64{x(s), float64(v)})
		}
		late[0].Points = append(late[0].Points, [2]float64{x(s), s.total.OldestReady.Seconds()})
		if i > 0 {
			p := samples[i-1]
			secs := s.at.Sub(p.at).Seconds()
			rate[0].Points = append(rate[0].Points, [2]float64{x(s), float64(s.finished-p.finished) / secs})
			rate[1].Points = append(rate[1].Points, [2]float64{x(s), float64(s.dead-p.dead) / secs})
		}
	}
	charts := []svgchart.Chart{
		{Title: "Jobs by state", XLabel: "seconds (0 = now)", YLabel: "jobs", Series: counts},
		{Title: "Lateness: the oldest ready job's wait", XLabel: "seconds (0 = now)", YLabel: "seconds", Series: late},
	}
	if h.meter != nil {
		charts = append(charts, svgchart.Chart{Title: "Throughput (this process)", XLabel: "seconds (0 = now)", YLabel: "jobs per second", Series: rate})
	}
	out := make([]template.HTML, len(charts))
	for i, c := range charts {
		svg := bytes.Replace(c.SVG(), []byte("<svg "), []byte(`<svg class="chart" viewBox="0 0 720 420" role="img" `), 1)
		out[i] = template.HTML(svg) // #nosec: numbers and constant titles only
	}
	return out
}
