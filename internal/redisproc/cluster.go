package redisproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/dqueue/delayqueue/internal/slot"
	"github.com/redis/go-redis/v9"
)

// Cluster is a local Redis Cluster: masters with the hash slots split
// evenly in contiguous ranges, each with its replicas.
type Cluster struct {
	Masters  []*Server
	Replicas []*Server // replicas of Masters[i] are Replicas[i*r : (i+1)*r]
}

// Addrs lists the addresses of every node.
func (c *Cluster) Addrs() []string {
	var addrs []string
	for _, s := range c.Nodes() {
		addrs = append(addrs, s.Addr)
	}
	return addrs
}

// Nodes lists every node, masters first.
func (c *Cluster) Nodes() []*Server {
	return append(append([]*Server(nil), c.Masters...), c.Replicas...)
}

// Stop ends every node.
func (c *Cluster) Stop() {
	for _, s := range c.Nodes() {
		s.Stop()
	}
}

// StartCluster starts masters cluster-enabled servers, each with replicas
// replicas, under dir; assigns the slots; introduces the nodes to each
// other; and returns once every node reports cluster_state:ok and every
// replica is in sync. config is passed to every node.
func StartCluster(path, dir string, masters, replicas int, config ...string) (*Cluster, error) {
	c := &Cluster{}
	node := func(i int) (*Server, error) {
		d := filepath.Join(dir, "node"+strconv.Itoa(i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		return Start(path, d, append([]string{
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no",
		}, config...)...)
	}
	for i := range masters * (1 + replicas) {
		s, err := node(i)
		if err != nil {
			c.Stop()
			return nil, err
		}
		if i < masters {
			c.Masters = append(c.Masters, s)
		} else {
			c.Replicas = append(c.Replicas, s)
		}
	}
	if err := c.form(masters, replicas); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) form(masters, replicas int) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	clients := map[*Server]*redis.Client{}
	for _, s := range c.Nodes() {
		clients[s] = redis.NewClient(&redis.Options{Addr: s.Addr})
		defer clients[s].Close()
	}
	for i, m := range c.Masters {
		lo, hi := i*slot.Count/masters, (i+1)*slot.Count/masters-1
		if err := clients[m].Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			return fmt.Errorf("redisproc: assign slots %d-%d: %w", lo, hi, err)
		}
	}
	first := clients[c.Masters[0]]
	for _, s := range c.Nodes()[1:] {
		host, port, _ := strings.Cut(s.Addr, ":")
		if err := first.ClusterMeet(ctx, host, port).Err(); err != nil {
			return fmt.Errorf("redisproc: cluster meet %s: %w", s.Addr, err)
		}
	}
	n := len(c.Nodes())
	if err := waitFor(ctx, "every node knows every other", func() bool {
		for _, cl := range clients {
			nodes, err := cl.ClusterNodes(ctx).Result()
			if err != nil || strings.Count(strings.TrimSpace(nodes), "\n")+1 != n {
				return false
			}
		}
		return true
	}); err != nil {
		return err
	}
	for i, m := range c.Masters {
		id, err := clients[m].ClusterMyID(ctx).Result()
		if err != nil {
			return fmt.Errorf("redisproc: cluster myid: %w", err)
		}
		for _, r := range c.Replicas[i*replicas : (i+1)*replicas] {
			if err := clients[r].ClusterReplicate(ctx, id).Err(); err != nil {
				return fmt.Errorf("redisproc: cluster replicate: %w", err)
			}
		}
	}
	return waitFor(ctx, "cluster_state:ok, every slot's master known to every node, and replicas in sync", func() bool {
		for _, s := range c.Nodes() {
			info, err := clients[s].ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false
			}
			// A node may say ok before it has heard which master owns
			// every slot (full coverage is not required): a client that
			// read its slot map then would be sent from node to node.
			slots, err := clients[s].ClusterSlots(ctx).Result()
			if err != nil {
				return false
			}
			known := 0
			for _, r := range slots {
				known += int(r.End - r.Start + 1)
			}
			if known != slot.Count {
				return false
			}
		}
		for _, r := range c.Replicas {
			info, err := clients[r].Info(ctx, "replication").Result()
			if err != nil || !strings.Contains(info, "master_link_status:up") {
				return false
			}
		}
		return true
	})
}

// Sentinels is a primary with replicas, watched by sentinels under the
// master name "mymaster".
type Sentinels struct {
	Primary   *Server
	Replicas  []*Server
	Sentinels []*Server
}

// MasterName is the name the sentinels know the primary by.
const MasterName = "mymaster"

// SentinelAddrs lists the sentinels' addresses.
func (s *Sentinels) SentinelAddrs() []string {
	var addrs []string
	for _, x := range s.Sentinels {
		addrs = append(addrs, x.Addr)
	}
	return addrs
}

// Stop ends every process.
func (s *Sentinels) Stop() {
	for _, x := range append(append([]*Server{s.Primary}, s.Replicas...), s.Sentinels...) {
		if x != nil {
			x.Stop()
		}
	}
}

// StartSentinels starts a primary, replicas replicas and sentinels sentinels
// (quorum: a majority) that fail over after 1 s without an answer. It
// returns once the replicas are in sync and every sentinel sees them.
func StartSentinels(path, dir string, replicas, sentinels int) (*Sentinels, error) {
	s := &Sentinels{}
	sub := func(name string) (string, error) {
		d := filepath.Join(dir, name)
		return d, os.MkdirAll(d, 0o755)
	}
	d, err := sub("primary")
	if err == nil {
		s.Primary, err = Start(path, d)
	}
	for i := 0; err == nil && i < replicas; i++ {
		if d, err = sub("replica" + strconv.Itoa(i)); err == nil {
			host, port, _ := strings.Cut(s.Primary.Addr, ":")
			var r *Server
			r, err = Start(path, d, "--replicaof", host, port)
			s.Replicas = append(s.Replicas, r)
		}
	}
	for i := 0; err == nil && i < sentinels; i++ {
		if d, err = sub("sentinel" + strconv.Itoa(i)); err == nil {
			var x *Server
			x, err = startSentinel(path, d, s.Primary.Addr, sentinels/2+1)
			s.Sentinels = append(s.Sentinels, x)
		}
	}
	if err == nil {
		err = s.waitReady(replicas)
	}
	if err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

func startSentinel(path, dir, primary string, quorum int) (*Server, error) {
	host, port, _ := strings.Cut(primary, ":")
	return startOnFreePort(path, dir, func(p string) ([]string, error) {
		conf := filepath.Join(dir, "sentinel.conf")
		body := fmt.Sprintf("port %s\nbind 127.0.0.1\ndir %s\nlogfile %s\n"+
			"sentinel monitor %s %s %s %d\n"+
			"sentinel down-after-milliseconds %s 1000\n"+
			"sentinel failover-timeout %s 5000\n"+
			"sentinel parallel-syncs %s 1\n",
			p, dir, filepath.Join(dir, "redis.log"), MasterName, host, port, quorum, MasterName, MasterName, MasterName)
		return []string{conf, "--sentinel"}, os.WriteFile(conf, []byte(body), 0o644)
	})
}

func (s *Sentinels) waitReady(replicas int) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return waitFor(ctx, "replicas in sync and known to every sentinel", func() bool {
		for _, r := range s.Replicas {
			c := redis.NewClient(&redis.Options{Addr: r.Addr})
			info, err := c.Info(ctx, "replication").Result()
			_ = c.Close()
			if err != nil || !strings.Contains(info, "master_link_status:up") {
				return false
			}
		}
		for _, x := range s.Sentinels {
			c := redis.NewSentinelClient(&redis.Options{Addr: x.Addr})
			got, err := c.Replicas(ctx, MasterName).Result()
			_ = c.Close()
			if err != nil || len(got) != replicas {
				return false
			}
		}
		return true
	})
}

// waitFor polls cond every 20 ms until it holds or ctx ends.
func waitFor(ctx context.Context, what string, cond func() bool) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("redisproc: waiting for %s", what), ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}
