package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRunPrintsTheScrapeAndDrawsIt runs the example on a few jobs: every
// job pushed is settled, the scrape says so, and the chart is an SVG.
func TestRunPrintsTheScrapeAndDrawsIt(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "lateness.svg")
	var out bytes.Buffer
	cfg := config{jobs: 100, spread: 200 * time.Millisecond, topics: map[string]float64{"email": 0.1, "sms": 0.5}, svg: svg}
	require.NoError(t, run(context.Background(), &out, cfg))

	sum := func(metric string) int {
		n := 0
		for _, m := range regexp.MustCompile(`(?m)^`+metric+`\{[^}]*\} (\d+)$`).FindAllStringSubmatch(out.String(), -1) {
			v, err := strconv.Atoi(m[1])
			require.NoError(t, err)
			n += v
		}
		return n
	}
	assert.Equal(t, 100, sum("delayqueue_jobs_pushed_total"))
	assert.Equal(t, 100, sum("delayqueue_jobs_finished_total")+sum("delayqueue_jobs_dead_total"), "every job settled")
	assert.Equal(t, sum("delayqueue_jobs_delivered_total"), sum("delayqueue_handler_duration_seconds_count"))
	assert.Contains(t, out.String(), `delayqueue_up{queue="observability"} 1`)
	sends := 0
	for _, m := range regexp.MustCompile(`(?m)^  (\d+) "send \w+" spans$`).FindAllStringSubmatch(out.String(), -1) {
		n, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		sends += n
	}
	assert.Equal(t, 100, sends, "a send span per job")
	assert.Regexp(t, `e\.g\. "process \w+" in trace \w+ links to its job's send span in trace \w+`, out.String())

	f, err := os.Open(svg)
	require.NoError(t, err)
	defer f.Close()
	var doc struct {
		XMLName  xml.Name
		Polyline []struct{} `xml:"polyline"`
	}
	require.NoError(t, xml.NewDecoder(f).Decode(&doc))
	assert.Equal(t, "svg", doc.XMLName.Local)
	assert.Len(t, doc.Polyline, 2, "a line per topic")
}
