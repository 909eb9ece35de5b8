package delayqueue

import (
	"github.com/redis/go-redis/v9"
)

// The blocked calls (a BLMPOP on ready signals, a BLPOP at a topic's
// limit) hold a connection for up to blockFor each: one per bucket on a
// Cluster for every started instance, and one per topic waiting at its
// limit. On the pool the scripts use, enough of them would leave the
// scripts no connection, and a call that finishes a job would wait for a
// blocked call to end. So they go through a client of their own, made from
// the options of the queue's client: a pool apart, connections dialled when
// first needed, closed by Close. A Sentinel client, and a client of another
// kind (a Ring, or a wrapper of the caller's), is used as it is.

// blocker returns the client of the blocked calls, made on first use;
// ErrClosed after Close.
func (q *DelayQueue) blocker() (redis.UniversalClient, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed.Load() {
		return nil, ErrClosed
	}
	if q.blocking == nil {
		q.blocking, q.ownBlocking = blockingClient(q.client, q.opts.buckets+maxLimitWaits)
	}
	return q.blocking, nil
}

// sentinelAddr is the address go-redis gives the options of a Sentinel
// (failover) client.
const sentinelAddr = "FailoverClient"

// maxLimitWaits is room in the blocked calls' pool for topics waiting at
// their concurrency limit, beyond a blocked call per bucket.
const maxLimitWaits = 64

// blockingClient returns a client like c, on connections of its own with
// room for at least conns of them (per node on a Cluster: the caller's
// PoolSize may be too small for a blocked call per bucket), and whether it
// is a new one (which its maker closes). A Sentinel client is not copied:
// its copy would find the master through the same dialer, but miss the
// switch that closes the connections to the old master at a failover, and
// wait out a blocked call on a master that is gone.
func blockingClient(c redis.UniversalClient, conns int) (redis.UniversalClient, bool) {
	switch c := c.(type) {
	case *redis.Client:
		o := *c.Options()
		if o.Addr == sentinelAddr {
			return c, false
		}
		roomFor(&o.PoolSize, &o.MaxActiveConns, &o.MinIdleConns, conns)
		return redis.NewClient(&o), true
	case *redis.ClusterClient:
		o := *c.Options()
		roomFor(&o.PoolSize, &o.MaxActiveConns, &o.MinIdleConns, conns)
		return redis.NewClusterClient(&o), true // noteError has it reload its slots too
	}
	return c, false
}

// roomFor sets a pool's options to allow conns connections at once, dialled
// only as they are needed.
func roomFor(size, active, idle *int, conns int) {
	*size = max(*size, conns)
	if *active > 0 {
		*active = max(*active, conns)
	}
	*idle = 0
}

// closeBlocker closes the blocked calls' client, once they have ended.
func (q *DelayQueue) closeBlocker() error {
	q.mu.Lock()
	c, own := q.blocking, q.ownBlocking
	q.blocking, q.ownBlocking = nil, false
	q.mu.Unlock()
	if c == nil || !own {
		return nil
	}
	return c.Close()
}
