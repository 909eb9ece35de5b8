package main

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/dqueue/delayqueue/internal/svgchart"
	"github.com/prometheus/common/expfmt"
)

// drawLateness draws the lateness histogram as Prometheus scraped it: for
// each topic, the share of deliveries at most as late as each bucket's
// upper bound. svgchart is this repository's own; any plotting will do.
func drawLateness(scraped string, cfg config) error {
	var parser expfmt.TextParser
	families, err := parser.TextToMetricFamilies(strings.NewReader(scraped))
	if err != nil {
		return err
	}
	family := families["delayqueue_delivery_lateness_seconds"]
	if family == nil {
		return fmt.Errorf("no delayqueue_delivery_lateness_seconds in the scrape")
	}
	c := svgchart.Chart{
		Title:  fmt.Sprintf("delayqueue_delivery_lateness_seconds: %d jobs due over %v", cfg.jobs, cfg.spread),
		XLabel: "lateness, bucket's upper bound le (ms)", YLabel: "deliveries at most this late (%)",
		LogX: true,
	}
	for _, m := range family.GetMetric() {
		h := m.GetHistogram()
		if h.GetSampleCount() == 0 {
			continue
		}
		topic := ""
		for _, l := range m.GetLabel() {
			if l.GetName() == "topic" {
				topic = l.GetValue()
			}
		}
		s := svgchart.Series{Name: fmt.Sprintf("%s (%d)", topic, h.GetSampleCount())}
		for _, b := range h.GetBucket() {
			if !math.IsInf(b.GetUpperBound(), 1) {
				s.Points = append(s.Points, [2]float64{b.GetUpperBound() * 1000, 100 * float64(b.GetCumulativeCount()) / float64(h.GetSampleCount())})
			}
		}
		c.Series = append(c.Series, s)
	}
	slices.SortFunc(c.Series, func(a, b svgchart.Series) int { return strings.Compare(a.Name, b.Name) })
	for i := range c.Series {
		c.Series[i].Color = svgchart.Colors[i%len(svgchart.Colors)]
	}
	return c.Write(cfg.svg)
}
