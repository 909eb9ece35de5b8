package main

import (
	"strings"
	"testing"

	"github.com/dqueue/delayqueue/internal/redisproc"
	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The other two ways to reach a queue: through Sentinel, and on a Cluster,
// where the queue's buckets spread over the masters.

// checkDeployment runs the commands that read and write on f's queue.
func checkDeployment(t *testing.T, f *fixture) {
	t.Helper()
	out := f.ok(t, "stats")
	assert.Regexp(t, `(?m)^orders +1 +1 +1 +0 +\S+ +no$`, out)
	assert.Regexp(t, `(?m)^TOTAL +1 +2 +1 +1 `, out)
	assert.Contains(t, f.ok(t, "list", "mail", "--state", "dead"), f.dead)
	id := strings.TrimSpace(f.ok(t, "push", "orders", "--body", "there and back"))
	assert.Equal(t, "there and back", f.ok(t, "get", id, "--raw"))
	assert.Equal(t, "purged 1 dead jobs of mail\n", f.ok(t, "purge", "mail", "--yes"))
	f.noLeases(t)
}

func TestCluster(t *testing.T) {
	c := redistest.SharedCluster(t)
	f := newFixture(t, redistest.ClusterClient(t, c), "--cluster", strings.Join(c.Addrs(), ","))
	checkDeployment(t, f)
	var st struct{ Buckets int }
	f.json(t, &st, "stats")
	assert.Equal(t, 8, st.Buckets, "a queue made on a Cluster")
}

func TestSentinel(t *testing.T) {
	s := redistest.StartSentinels(t)
	client := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: redisproc.MasterName, SentinelAddrs: s.SentinelAddrs()})
	t.Cleanup(func() { _ = client.Close() })
	f := newFixture(t, client, "--sentinel", strings.Join(s.SentinelAddrs(), ","), "--master", redisproc.MasterName)
	checkDeployment(t, f)
	r := f.run(t, "topics")
	assert.Empty(t, r.stderr, "no chatter from go-redis")

	r = ctl(t, nil, "", "--sentinel", s.SentinelAddrs()[0], "stats")
	assert.Equal(t, exitUsage, r.code, "--sentinel without --master")
	assert.Contains(t, r.stderr, "needs --master")
	r = ctl(t, nil, "", "--sentinel", s.SentinelAddrs()[0], "--master", "nobody", "--queue", f.name, "stats")
	require.Equal(t, exitError, r.code)
}
