package dashboard

import (
	"bytes"
	"context"
	"html/template"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/internal/svgchart"
)

// The charts: the queue's, or a topic's, figures over the last hour, from
// the history that the started processes keep in Redis
// (delayqueue.History), so that they show the same wherever the dashboard
// is mounted, in a process that never starts as well, and cost one read
// of Redis: the overview's with its cached figures, a topic page's per
// view.

// historyReader is the method a Queue may have to read the history, as
// *delayqueue.DelayQueue has: without it, the dashboard draws no chart.
type historyReader interface {
	History(ctx context.Context, topic string) ([]delayqueue.Sample, error)
}

// history reads the history of topic ("" for the queue) when q keeps one.
func history(ctx context.Context, q Queue, topic string) ([]delayqueue.Sample, error) {
	if r, ok := q.(historyReader); ok {
		return r.History(ctx, topic)
	}
	return nil, nil
}

// chartsData is what a page shows of a history.
type chartsData struct {
	Charts  []template.HTML
	Samples int // how many samples there are
}

// charts draws the samples, once there are two. Their SVG is made by
// internal/svgchart from numbers and this file's own titles: no topic,
// ID or body goes into it.
func charts(samples []delayqueue.Sample) chartsData {
	data := chartsData{Samples: len(samples)}
	if len(samples) < 2 {
		return data
	}
	last := samples[len(samples)-1].At
	x := func(s delayqueue.Sample) float64 { return -last.Sub(s.At).Minutes() }
	counts := []svgchart.Series{
		{Name: "ready", Color: svgchart.Colors[0]},
		{Name: "delayed", Color: svgchart.Colors[1]},
		{Name: "reserved", Color: svgchart.Colors[2]},
		{Name: "dead", Color: svgchart.Colors[3]},
	}
	late := []svgchart.Series{
		{Name: "oldest ready job's wait", Color: svgchart.Colors[0]},
		{Name: "reservations: the latest", Color: svgchart.Colors[3]},
		{Name: "reservations: mean", Color: svgchart.Colors[2]},
	}
	rate := []svgchart.Series{{Name: "finished", Color: svgchart.Colors[2]}, {Name: "died", Color: svgchart.Colors[3]}}
	for _, s := range samples {
		at := x(s)
		for j, v := range []int{s.Ready, s.Delayed, s.Reserved, s.Dead} {
			counts[j].Points = append(counts[j].Points, [2]float64{at, float64(v)})
		}
		for j, v := range []float64{s.OldestReady.Seconds(), s.MaxLateness.Seconds(), s.Lateness.Seconds()} {
			late[j].Points = append(late[j].Points, [2]float64{at, v})
		}
		if secs := s.Span.Seconds(); secs > 0 {
			rate[0].Points = append(rate[0].Points, [2]float64{at, float64(s.Finished) / secs})
			rate[1].Points = append(rate[1].Points, [2]float64{at, float64(s.Died) / secs})
		}
	}
	const xLabel = "minutes (0 = the latest sample)"
	list := []svgchart.Chart{
		{Title: "Jobs by state", XLabel: xLabel, YLabel: "jobs", Series: counts},
		{Title: "Throughput", XLabel: xLabel, YLabel: "jobs per second", Series: rate},
		{Title: "Lateness", XLabel: xLabel, YLabel: "seconds", Series: late},
	}
	data.Charts = make([]template.HTML, len(list))
	for i, c := range list {
		svg := bytes.Replace(c.SVG(), []byte("<svg "), []byte(`<svg class="chart" viewBox="0 0 720 420" role="img" `), 1)
		data.Charts[i] = template.HTML(svg) // #nosec: numbers and constant titles only
	}
	return data
}
