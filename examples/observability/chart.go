package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/dqueue/delayqueue/internal/svgchart"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// drawLateness draws the lateness histogram as Prometheus scraped it: for
// each topic, the share of deliveries at most as late as each bucket's
// upper bound, up to the first bound that holds every delivery. svgchart is
// this repository's own; any plotting will do.
func drawLateness(scraped string, cfg config) error {
	var parser expfmt.TextParser
	families, err := parser.TextToMetricFamilies(strings.NewReader(scraped))
	if err != nil {
		return err
	}
	var topics []*dto.Metric
	for _, m := range families["delayqueue_delivery_lateness_seconds"].GetMetric() {
		if m.GetHistogram().GetSampleCount() > 0 {
			topics = append(topics, m)
		}
	}
	if len(topics) == 0 {
		return errors.New("no delivery lateness in the scrape")
	}
	// The first bound that holds every delivery of every topic.
	last := 0.0
	for _, m := range topics {
		h := m.GetHistogram()
		for _, b := range h.GetBucket() {
			if b.GetCumulativeCount() == h.GetSampleCount() {
				last = max(last, b.GetUpperBound())
				break
			}
		}
	}
	c := svgchart.Chart{
		Title:  fmt.Sprintf("delayqueue_delivery_lateness_seconds: %d jobs due over %v", cfg.jobs, cfg.spread),
		XLabel: "lateness: the bucket's upper bound le (ms)", YLabel: "deliveries at most this late (%)",
	}
	for _, m := range topics {
		h := m.GetHistogram()
		s := svgchart.Series{Name: fmt.Sprintf("%s (%d)", label(m, "topic"), h.GetSampleCount())}
		for _, b := range h.GetBucket() {
			if b.GetUpperBound() <= last {
				s.Points = append(s.Points, [2]float64{b.GetUpperBound() * 1000,
					100 * float64(b.GetCumulativeCount()) / float64(h.GetSampleCount())})
			}
		}
		c.Series = append(c.Series, s)
	}
	slices.SortFunc(c.Series, func(a, b svgchart.Series) int { return strings.Compare(a.Name, b.Name) })
	for i := range c.Series {
		c.Series[i].Color = svgchart.Colors[i%len(svgchart.Colors)]
	}
	// A log scale once the bounds span more than two powers of ten.
	c.LogX = last/topics[0].GetHistogram().GetBucket()[0].GetUpperBound() > 100
	return c.Write(cfg.svg)
}

// label is the value of m's label name.
func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
