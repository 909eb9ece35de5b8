package main

import (
	"context"
	"testing"

	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBacklogTimesEveryMoveAndPutsSlowlogBack(t *testing.T) {
	srv := redistest.Start(t, "--slowlog-log-slower-than", "5000", "--slowlog-max-len", "64")
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	b := &bench{client: c, nodes: []*redis.Client{c}, addrs: []string{srv.Addr}, observe: observeNone}
	old := backlogJobs
	backlogJobs = 2_000
	t.Cleanup(func() { backlogJobs = old })

	ctx := context.Background()
	figs, err := backlog(ctx, b)
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range figs {
		got[f.name] = f.value
	}
	// Moves go 200 jobs a call: the ten or more calls of the drain.
	assert.GreaterOrEqual(t, got["script calls"], 10.0)
	assert.Greater(t, got["jobs made ready per second"], 0.0)
	assert.LessOrEqual(t, got["script call, median"], got["script call, p99"])
	assert.LessOrEqual(t, got["script call, p99"], got["script call, longest"])

	cfg, err := c.ConfigGet(ctx, "slowlog-*").Result()
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"slowlog-log-slower-than": "5000", "slowlog-max-len": "64"}, cfg)
	n, err := c.SlowLogLen(ctx).Result()
	require.NoError(t, err)
	assert.LessOrEqual(t, n, int64(1), "the log of every command is emptied (but for what came since)")
}
