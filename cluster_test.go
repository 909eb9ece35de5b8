package delayqueue

// Redis Cluster and Sentinel: the spread of a queue over the masters, and
// failover and resharding under steady load. The core behaviour tests run on
// a 3-master cluster too, through forEachBackend.

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/dqueue/delayqueue/internal/slot"
	"github.com/dqueue/delayqueue/internal/syncbuf"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestClusterSpreadsAQueueOverEveryMaster(t *testing.T) {
	ctx := context.Background()
	c := redistest.SharedCluster(t)
	cc := redistest.ClusterClient(t, c)
	q := newQueue(t, cc) // the default 8 buckets
	pushN(t, q, 800, func(int) *Job { return &Job{Topic: "t", Delay: time.Hour} })

	var spread []string
	for _, m := range c.Masters {
		mc := redis.NewClient(&redis.Options{Addr: m.Addr})
		keys, err := mc.Keys(ctx, "dq:{"+q.opts.name+":*").Result()
		require.NoError(t, err)
		_ = mc.Close()
		jobs := 0
		for _, k := range keys {
			if strings.HasSuffix(k, ":pool") {
				jobs += int(cc.HLen(ctx, k).Val())
			}
		}
		spread = append(spread, fmt.Sprintf("%s: %d keys, %d jobs", m.Addr, len(keys), jobs))
		assert.NotEmpty(t, keys, "master %s holds part of the queue", m.Addr)
	}
	t.Logf("CLUSTER keys per master for 8 buckets, 800 jobs: %s", strings.Join(spread, "; "))
}

// steadyLoad pushes and consumes jobs on q until stopped, counting what was
// acknowledged and delivered.
type steadyLoad struct {
	q         *DelayQueue
	mu        sync.Mutex
	acked     []string
	ackedAt   []time.Time
	pushErrs  int
	lastErrAt time.Time
	delivered map[string]int
	lastDel   time.Time
	seq       atomic.Int64
	stop      context.CancelFunc
	producers sync.WaitGroup
	consumers sync.WaitGroup
	cancelC   context.CancelFunc
}

func startLoad(q *DelayQueue) *steadyLoad {
	l := &steadyLoad{q: q, delivered: map[string]int{}}
	pctx, stop := context.WithCancel(context.Background())
	cctx, cancelC := context.WithCancel(context.Background())
	l.stop, l.cancelC = stop, cancelC
	for range 2 {
		l.producers.Add(1)
		go func() {
			defer l.producers.Done()
			pause := time.NewTimer(0)
			defer pause.Stop()
			for pctx.Err() == nil {
				id := fmt.Sprintf("load-%d", l.seq.Add(1))
				ctx, cancel := context.WithTimeout(pctx, 2*time.Second)
				_, err := q.Push(ctx, &Job{ID: id, Topic: "t", Delay: time.Duration(rand.IntN(100)) * time.Millisecond})
				cancel()
				l.mu.Lock()
				if err == nil {
					l.acked = append(l.acked, id)
					l.ackedAt = append(l.ackedAt, time.Now())
				} else {
					l.pushErrs++
					l.lastErrAt = time.Now()
				}
				l.mu.Unlock()
				if err != nil {
					pause.Reset(50 * time.Millisecond) // Redis is failing over
					select {
					case <-pause.C:
					case <-pctx.Done():
					}
				}
			}
		}()
	}
	for range 4 {
		l.consumers.Add(1)
		go func() {
			defer l.consumers.Done()
			for cctx.Err() == nil {
				job, err := q.Pop(cctx, "t", time.Second)
				if err != nil {
					continue
				}
				fctx, cancel := context.WithTimeout(cctx, 2*time.Second)
				_ = q.Finish(fctx, job.ID)
				cancel()
				l.mu.Lock()
				l.delivered[job.ID]++
				l.lastDel = time.Now()
				l.mu.Unlock()
			}
		}()
	}
	return l
}

// ackedSince counts pushes acknowledged after t.
func (l *steadyLoad) ackedSince(t time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, at := range l.ackedAt {
		if at.After(t) {
			n++
		}
	}
	return n
}

func (l *steadyLoad) deliveredCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.delivered)
}

// finish stops the producers, lets the consumers drain what was
// acknowledged (or stop when nothing arrives for quiet), and returns the
// acknowledged jobs never delivered and the extra deliveries.
func (l *steadyLoad) finish(t *testing.T, quiet time.Duration) (acked, lost, dup int) {
	l.stop()
	l.producers.Wait()
	l.mu.Lock()
	l.lastDel = time.Now()
	l.mu.Unlock()
	require.Eventually(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		missing := 0
		for _, id := range l.acked {
			if l.delivered[id] == 0 {
				missing++
			}
		}
		return missing == 0 || time.Since(l.lastDel) > quiet
	}, 2*time.Minute, 10*time.Millisecond)
	l.cancelC()
	l.consumers.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range l.acked {
		if l.delivered[id] == 0 {
			lost++
		}
	}
	for _, n := range l.delivered {
		dup += n - 1
	}
	return len(l.acked), lost, dup
}

// failover runs steady load, calls kill once 2,000 pushes were acknowledged,
// and checks that pushing and delivering go on afterwards without restarts.
func failover(t *testing.T, name string, q *DelayQueue, kill func()) {
	startQueue(t, q)
	l := startLoad(q)
	require.Eventually(t, func() bool { return l.ackedSince(time.Time{}) >= 2000 }, time.Minute, 5*time.Millisecond)
	before := l.deliveredCount()
	killedAt := time.Now()
	kill()
	require.Eventually(t, func() bool { return l.ackedSince(killedAt) >= 2000 }, 2*time.Minute, 5*time.Millisecond,
		"producers push again after the failover")
	require.Eventually(t, func() bool { return l.deliveredCount() >= before+2000 }, 2*time.Minute, 5*time.Millisecond,
		"consumers, blocked in Pop during the failover, get jobs again")
	l.mu.Lock()
	pushErrs, downtime := l.pushErrs, l.lastErrAt.Sub(killedAt)
	l.mu.Unlock()
	acked, lost, dup := l.finish(t, 15*time.Second)
	t.Logf("FAILOVER %s: acknowledged=%d lost=%d delivered-twice=%d push errors=%d, the last %v after the kill",
		name, acked, lost, dup, pushErrs, downtime.Round(time.Millisecond))
}

func TestClusterMasterFailover(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	cc := redistest.ClusterClient(t, c)
	q := newQueue(t, cc, WithDefaultTTR(5*time.Second), WithLease(2*time.Second), WithSafetyPoll(time.Second))
	failover(t, "cluster 3 masters + 3 replicas, one master SIGKILLed", q, c.Masters[0].Kill)
}

func TestSentinelFailover(t *testing.T) {
	s := redistest.StartSentinels(t)
	fc := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: s.SentinelAddrs()})
	t.Cleanup(func() { _ = fc.Close() })
	q := newQueue(t, fc, WithDefaultTTR(5*time.Second), WithLease(2*time.Second), WithSafetyPoll(time.Second))
	failover(t, "sentinel, primary + 2 replicas, primary SIGKILLed", q, s.Primary.Kill)
}

func TestClusterReshardingABusyBucketLosesNothing(t *testing.T) {
	ctx := context.Background()
	c := redistest.StartCluster(t, 3, 0)
	cc := redistest.ClusterClient(t, c)
	// No safety poll within the test: after the move, jobs of the moved
	// bucket arrive only if the wake-ups follow the slot to its new master.
	q := newQueue(t, cc, WithDefaultTTR(5*time.Second), WithSafetyPoll(time.Hour), WithLease(time.Hour))
	startQueue(t, q)
	l := startLoad(q)
	require.Eventually(t, func() bool { return l.ackedSince(time.Time{}) >= 2000 }, time.Minute, 5*time.Millisecond)

	// Move the slot of bucket 0 from its master to the next one, key by key,
	// as redis-cli --cluster reshard does.
	s := slot.Of(q.keys.bucket(0).pool)
	src, dst := c.Masters[s*3/slot.Count], c.Masters[(s*3/slot.Count+1)%3]
	sc := redis.NewClient(&redis.Options{Addr: src.Addr})
	dc := redis.NewClient(&redis.Options{Addr: dst.Addr})
	defer sc.Close()
	defer dc.Close()
	srcID, dstID := sc.ClusterMyID(ctx).Val(), dc.ClusterMyID(ctx).Val()
	require.NoError(t, dc.Do(ctx, "CLUSTER", "SETSLOT", s, "IMPORTING", srcID).Err())
	require.NoError(t, sc.Do(ctx, "CLUSTER", "SETSLOT", s, "MIGRATING", dstID).Err())
	host, port, _ := strings.Cut(dst.Addr, ":")
	moved := 0
	for {
		keys, err := sc.ClusterGetKeysInSlot(ctx, s, 1).Result()
		require.NoError(t, err)
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		require.NoError(t, sc.Do(ctx, args...).Err())
		moved += len(keys)
		pause := time.NewTimer(20 * time.Millisecond) // let the load run against a split slot
		<-pause.C
	}
	for _, m := range c.Masters {
		mc := redis.NewClient(&redis.Options{Addr: m.Addr})
		require.NoError(t, mc.Do(ctx, "CLUSTER", "SETSLOT", s, "NODE", dstID).Err())
		_ = mc.Close()
	}
	resharded := time.Now()
	require.Eventually(t, func() bool { return l.ackedSince(resharded) >= 1000 }, time.Minute, 5*time.Millisecond)
	acked, lost, dup := l.finish(t, 15*time.Second)
	t.Logf("RESHARD slot %d of bucket 0 moved key by key (%d keys) under load: acknowledged=%d lost=%d delivered-twice=%d",
		s, moved, acked, lost, dup)
	assert.Zero(t, lost, "no acknowledged job is lost when a slot moves")

}

// TestClusterASubscriptionSentToTheWrongNodeIsSentAgain starts a queue on a
// client whose slot map is stale: it sends every sharded subscription to one
// master, which refuses those of the other masters' slots with MOVED (and
// go-redis drops the refusal). The notifier must send them again, to the
// right masters, or a bucket handler there never hears a push.
func TestClusterASubscriptionSentToTheWrongNodeIsSentAgain(t *testing.T) {
	ctx := context.Background()
	c := redistest.SharedCluster(t)
	mc := redis.NewClient(&redis.Options{Addr: c.Masters[0].Addr})
	defer mc.Close()
	slots, err := mc.ClusterSlots(ctx).Result()
	require.NoError(t, err)
	var stale atomic.Bool
	stale.Store(true)
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: c.Addrs(),
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			if stale.Load() { // as if every slot were still on the first master
				return []redis.ClusterSlot{{Start: 0, End: slot.Count - 1, Nodes: []redis.ClusterNode{{Addr: c.Masters[0].Addr}}}}, nil
			}
			return slots, nil
		},
	})
	t.Cleanup(func() { _ = cc.Close() })
	var logs syncbuf.Buffer
	q := newQueue(t, cc, WithSafetyPoll(time.Hour), WithLease(time.Hour),
		WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	last := q.opts.buckets - 1 // on the last master
	require.NotEqual(t, c.Masters[0].Addr, masterOf(t, c.Masters[0].Addr, slot.Of(q.keys.bucket(last).wake)))

	startQueue(t, q)
	_, err = q.Pop(ctx, "t", 0) // subscribes to the ready channels
	require.ErrorIs(t, err, ErrNoJob)
	n := notesOf(t, q)
	refusal := regexp.MustCompile(`refused a subscription.* bucket=` + strconv.Itoa(last) + `\b`)
	require.Eventually(t, func() bool {
		// The last bucket's subscription went to the first master: it is
		// read, or was refused already (and is being sent again, by the
		// stale map, until the map is right).
		n.mu.Lock()
		sub := n.subs[last]
		sent := sub != nil && sub.done != nil && len(sub.confirmed) == 1
		n.mu.Unlock()
		return sent || refusal.MatchString(logs.String())
	}, 30*time.Second, time.Millisecond)
	stale.Store(false) // the slot map is right from now on
	cc.ReloadState(ctx)

	id := "j"
	for i := 0; bucketOf(id, q.opts.buckets) != last; i++ {
		id = fmt.Sprintf("j%d", i)
	}
	got := popAsync(q, "t", time.Minute)
	pushed(t, q, &Job{ID: id, Topic: "t", Delay: 100 * time.Millisecond})
	assert.Equal(t, id, received(t, got).ID, "the push woke the bucket's handler")
}

// masterOf returns the address of the master that serves slot s, as the
// node at addr sees it.
func masterOf(t *testing.T, addr string, s int) string {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	slots, err := c.ClusterSlots(context.Background()).Result()
	require.NoError(t, err)
	for _, r := range slots {
		if s >= r.Start && s <= r.End {
			return r.Nodes[0].Addr
		}
	}
	return ""
}

// TestClusterASubscriptionCutOffIsSentAgainToItsNode cuts every pub/sub
// connection of a queue. go-redis dials a sharded subscription's connection
// again to a random node (it routes by the channels of SUBSCRIBE only), which
// refuses it with MOVED unless it owns the bucket's slot; the notifier must
// subscribe again on the right one, or the bucket handlers there never hear
// a push.
func TestClusterASubscriptionCutOffIsSentAgainToItsNode(t *testing.T) {
	ctx := context.Background()
	c := redistest.StartCluster(t, 3, 0)
	cc := redistest.ClusterClient(t, c)
	q := newQueue(t, cc, WithSafetyPoll(time.Hour), WithLease(time.Hour))
	startQueue(t, q)
	subscribed(t, q, "t")
	for _, m := range c.Masters {
		mc := redis.NewClient(&redis.Options{Addr: m.Addr})
		require.NoError(t, mc.ClientKillByFilter(ctx, "TYPE", "pubsub").Err())
		_ = mc.Close()
	}

	want, buckets := map[string]bool{}, map[int]bool{}
	for i := 0; len(want) < q.opts.buckets; i++ { // a job in every bucket
		id := fmt.Sprintf("j%d", i)
		if b := bucketOf(id, q.opts.buckets); !buckets[b] {
			want[id], buckets[b] = true, true
		}
	}
	for id := range want {
		pushed(t, q, &Job{ID: id, Topic: "t", Delay: 100 * time.Millisecond})
	}
	for range want {
		job, err := q.Pop(ctx, "t", 30*time.Second)
		require.NoError(t, err, "every bucket's handler heard its push")
		assert.True(t, want[job.ID])
		delete(want, job.ID)
		require.NoError(t, q.Finish(ctx, job.ID))
	}
}
