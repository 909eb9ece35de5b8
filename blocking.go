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
// first needed, closed by Close. A client of another kind (a Ring, or a
// wrapper of the caller's) is used as it is: the queue cannot copy it.

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

// maxLimitWaits is room in the blocked calls' pool for topics waiting at
// their concurrency limit, beyond a blocked call per bucket.
const maxLimitWaits = 64

// blockingClient returns a client like c, on connections of its own with
// room for at least conns of them (per node on a Cluster: the caller's
// PoolSize may be too small for a blocked call per bucket), and whether it
// is a new one (which its maker closes).
func blockingClient(c redis.UniversalClient, conns int) (redis.UniversalClient, bool) {
	switch c := c.(type) {
	case *redis.Client:
		o := *c.Options() // a Sentinel client's dialer comes along, and finds the master
		o.PoolSize, o.MinIdleConns = max(o.PoolSize, conns), 0
		return redis.NewClient(&o), true
	case *redis.ClusterClient:
		o := *c.Options()
		o.PoolSize, o.MinIdleConns = max(o.PoolSize, conns), 0
		return redis.NewClusterClient(&o), true
	}
	return c, false
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
