package delayqueue

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The blocked calls' client is a copy of a plain or Cluster client with
// room for them, and the Sentinel client itself: a copy of it would miss
// go-redis's closing of the old master's connections at a failover.
func TestBlockedCallsGetAClientOfTheirOwnExceptThroughSentinel(t *testing.T) {
	plain := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", PoolSize: 2, MaxActiveConns: 3})
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, PoolSize: 2})
	sentinel := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"}})
	for _, c := range []redis.UniversalClient{plain, cluster, sentinel} {
		t.Cleanup(func() { _ = c.Close() })
	}

	got, own := blockingClient(plain, 72)
	require.True(t, own)
	t.Cleanup(func() { _ = got.Close() })
	o := got.(*redis.Client).Options()
	assert.Equal(t, plain.Options().Addr, o.Addr)
	assert.Equal(t, 72, o.PoolSize)
	assert.Equal(t, 72, o.MaxActiveConns, "a cap on active connections leaves room too")

	got, own = blockingClient(cluster, 72)
	require.True(t, own)
	t.Cleanup(func() { _ = got.Close() })
	assert.Equal(t, 72, got.(*redis.ClusterClient).Options().PoolSize)

	got, own = blockingClient(sentinel, 72)
	assert.False(t, own)
	assert.Same(t, sentinel, got)
}
