package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/internal/svgchart"
)

// writeCharts draws S2's lateness distribution and S6's cost growth.
func (b *bench) writeCharts(dir, suffix string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if len(b.lateness) > 0 {
		c := svgchart.Chart{
			Title:  "S2: delivery lateness, 20,000 jobs due over 4 s, 16 workers",
			XLabel: "lateness (ms)", YLabel: "jobs delivered at most this late (%)",
		}
		for i, lates := range b.lateness {
			s := svgchart.Series{Name: fmt.Sprintf("run %d", i+1), Color: svgchart.Colors[i%len(svgchart.Colors)]}
			for k := 0; k <= 200; k++ {
				p := float64(k) / 2
				s.Points = append(s.Points, [2]float64{percentile(lates, p), p})
			}
			c.Series = append(c.Series, s)
		}
		if err := c.Write(filepath.Join(dir, "lateness"+suffix+".svg")); err != nil {
			return err
		}
	}
	if len(b.growth) > 0 {
		c := svgchart.Chart{
			Title:  "S6: Redis time per job as pending jobs grow",
			XLabel: "jobs already pending", YLabel: "µs of Redis script time per job",
			LogX: true,
		}
		for k, name := range []string{"push", "move"} {
			s := svgchart.Series{Name: name + " (median)", Color: svgchart.Colors[k]}
			for i, pending := range []float64{1e4, 1e5, 1e6} {
				var vals []float64
				for _, run := range b.growth {
					vals = append(vals, run[k][i])
				}
				slices.Sort(vals)
				s.Points = append(s.Points, [2]float64{pending, median(vals)})
			}
			c.Series = append(c.Series, s)
		}
		if err := c.Write(filepath.Join(dir, "growth"+suffix+".svg")); err != nil {
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
