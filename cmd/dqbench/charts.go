package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/dqueue/delayqueue"
)

var runColors = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"}

// writeCharts draws S2's lateness distribution and S6's cost growth.
func (b *bench) writeCharts(dir, suffix string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if len(b.lateness) > 0 {
		c := chart{
			title:  "S2: delivery lateness, 20,000 jobs due over 4 s, 16 workers",
			xLabel: "lateness (ms)", yLabel: "jobs delivered at most this late (%)",
		}
		for i, lates := range b.lateness {
			s := series{name: fmt.Sprintf("run %d", i+1), color: runColors[i%len(runColors)]}
			for k := 0; k <= 200; k++ {
				p := float64(k) / 2
				s.points = append(s.points, [2]float64{percentile(lates, p), p})
			}
			c.series = append(c.series, s)
		}
		if err := c.write(filepath.Join(dir, "lateness"+suffix+".svg")); err != nil {
			return err
		}
	}
	if len(b.growth) > 0 {
		c := chart{
			title:  "S6: Redis time per job as pending jobs grow",
			xLabel: "jobs already pending", yLabel: "µs of Redis script time per job",
			logX: true,
		}
		for k, name := range []string{"push", "move"} {
			s := series{name: name + " (median)", color: runColors[k]}
			for i, pending := range []float64{1e4, 1e5, 1e6} {
				var vals []float64
				for _, run := range b.growth {
					vals = append(vals, run[k][i])
				}
				slices.Sort(vals)
				s.points = append(s.points, [2]float64{pending, median(vals)})
			}
			c.series = append(c.series, s)
		}
		if err := c.write(filepath.Join(dir, "growth"+suffix+".svg")); err != nil {
			return err
		}
	}
	return nil
}

// waitReady waits until n jobs sit in the queue's ready lists.
func (b *bench) waitReady(ctx context.Context, q *delayqueue.DelayQueue, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		st, err := q.Counts(ctx, "bench")
		if err != nil {
			return err
		}
		if st.Ready >= n {
			return nil
		}
		<-tick.C
	}
	return fmt.Errorf("%d jobs not ready within %v", n, timeout)
}
