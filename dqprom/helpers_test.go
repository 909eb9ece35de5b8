package dqprom_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"

	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { os.Exit(redistest.Run(m)) }

var nameSeq atomic.Int64

// queueName gives each test its own queue on a shared Redis.
func queueName() string { return fmt.Sprintf("dqprom-%d", nameSeq.Add(1)) }

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// scrape reads reg as a Prometheus server does: over HTTP, through
// promhttp, in the text format. A collector's error fails the scrape.
func scrape(t *testing.T, reg prometheus.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var parser expfmt.TextParser
	families, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return families
}

// gather reads reg directly, for a condition to wait on; nil when it fails.
func gather(reg prometheus.Gatherer) map[string]*dto.MetricFamily {
	families, err := reg.Gather()
	if err != nil {
		return nil
	}
	got := make(map[string]*dto.MetricFamily, len(families))
	for _, f := range families {
		got[f.GetName()] = f
	}
	return got
}

// value is the figure of the one series of name whose labels include the
// pairs given (name, value, name, value...): a counter's or a gauge's
// value, a histogram's count of observations. It is -1 when there is no
// such series, and fails the test when there are several.
func value(t *testing.T, families map[string]*dto.MetricFamily, name string, pairs ...string) float64 {
	t.Helper()
	var found []*dto.Metric
	for _, m := range families[name].GetMetric() {
		if hasLabels(m, pairs) {
			found = append(found, m)
		}
	}
	switch len(found) {
	case 0:
		return -1
	case 1:
	default:
		t.Fatalf("%s%v: %d series", name, pairs, len(found))
	}
	m := found[0]
	switch families[name].GetType() {
	case dto.MetricType_COUNTER:
		return m.GetCounter().GetValue()
	case dto.MetricType_GAUGE:
		return m.GetGauge().GetValue()
	case dto.MetricType_HISTOGRAM:
		return float64(m.GetHistogram().GetSampleCount())
	}
	t.Fatalf("%s: type %v", name, families[name].GetType())
	return 0
}

// figure is a series a scrape should hold: its name, some of its labels
// (name, value, ...) and its value (see value).
type figure struct {
	name   string
	labels []string
	want   float64
}

// assertFigures checks each figure in a scrape; every series also carries
// the labels common.
func assertFigures(t *testing.T, got map[string]*dto.MetricFamily, figures []figure, common ...string) {
	t.Helper()
	for _, f := range figures {
		assert.Equal(t, f.want, value(t, got, f.name, append(f.labels, common...)...), "%s%v", f.name, f.labels)
	}
}

func hasLabels(m *dto.Metric, pairs []string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		ok := false
		for _, l := range m.GetLabel() {
			if l.GetName() == pairs[i] && l.GetValue() == pairs[i+1] {
				ok = true
			}
		}
		if !ok {
			return false
		}
	}
	return true
}
