package main

import (
	"context"
	"testing"
	"time"

	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOverviewCostMeasuresEachLoad(t *testing.T) {
	srv := redistest.Start(t, "--slowlog-log-slower-than", "1000000", "--slowlog-max-len", "64")
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	b := &bench{client: c, nodes: []*redis.Client{c}, addrs: []string{srv.Addr}, observe: observeNone}
	oldTopics, oldLoad := overviewTopics, overviewLoad
	overviewTopics, overviewLoad = 300, time.Second
	t.Cleanup(func() { overviewTopics, overviewLoad = oldTopics, oldLoad })

	figs, err := overviewCost(context.Background(), b)
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range figs {
		got[f.name] = f.value
	}
	assert.Equal(t, 300.0, got["topics"])
	for _, name := range []string{"Overview, wall time, median", "Overview, Redis time in its scripts", "Overview, longest script call",
		"dashboard: overview page", "dashboard: pages served", "dashboard: Overview calls",
		"PING max, idle", "PING max, 8 clients refreshing the dashboard", "PING max, 8 clients calling Overview"} {
		assert.Greater(t, got[name], 0.0, name)
	}
	assert.LessOrEqual(t, got["dashboard: Overview calls"], got["dashboard: pages served"], "a page reads at most one Overview")
	for _, under := range []string{"idle", "8 clients refreshing the dashboard", "8 clients calling Overview"} {
		assert.LessOrEqual(t, got["PING p50, "+under], got["PING p99, "+under], under)
		assert.LessOrEqual(t, got["PING p99, "+under], got["PING max, "+under], under)
	}
	cfg, err := c.ConfigGet(context.Background(), "slowlog-*").Result()
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"slowlog-log-slower-than": "1000000", "slowlog-max-len": "64"}, cfg, "SLOWLOG's settings are put back")
}
