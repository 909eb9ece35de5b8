package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/pflag"
)

// defaultQueue is the library's default queue name (delayqueue.WithName).
const defaultQueue = "default"

// connFlags say where the queue is.
type connFlags struct {
	addr        string
	sentinels   []string
	master      string
	cluster     []string
	db          int
	queue       string
	user        string
	passwordEnv string
}

func (c *connFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&c.addr, "addr", envOr("DQ_ADDR", "127.0.0.1:6379"), "Redis server `host:port` ($DQ_ADDR)")
	fs.StringSliceVar(&c.sentinels, "sentinel", nil, "Sentinel addresses, `host:port,...` (with --master)")
	fs.StringVar(&c.master, "master", "", "the primary's `name` as the sentinels know it")
	fs.StringSliceVar(&c.cluster, "cluster", nil, "Redis Cluster node addresses, `host:port,...`")
	fs.IntVar(&c.db, "db", 0, "database `number` (single server and Sentinel only)")
	fs.StringVar(&c.queue, "queue", envOr("DQ_QUEUE", defaultQueue), "queue `name` ($DQ_QUEUE)")
	fs.StringVar(&c.user, "user", os.Getenv("DQ_REDIS_USER"), "Redis ACL user `name` ($DQ_REDIS_USER; default: the default user)")
	fs.StringVar(&c.passwordEnv, "password-env", "DQ_REDIS_PASSWORD", "environment `variable` holding the Redis password")
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// client connects as the flags say: Cluster, Sentinel or one server.
func (c *connFlags) client() (redis.UniversalClient, error) {
	password := os.Getenv(c.passwordEnv)
	switch {
	case len(c.cluster) > 0 && len(c.sentinels) > 0:
		return nil, usagef("--cluster and --sentinel exclude each other")
	case len(c.cluster) > 0:
		if c.db != 0 {
			return nil, usagef("--db: a Redis Cluster has database 0 only")
		}
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.cluster, Username: c.user, Password: password}), nil
	case len(c.sentinels) > 0:
		if c.master == "" {
			return nil, usagef("--sentinel needs --master, the primary's name")
		}
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: c.master, SentinelAddrs: c.sentinels, DB: c.db,
			Username: c.user, Password: password, SentinelPassword: os.Getenv("DQ_SENTINEL_PASSWORD"),
		}), nil
	case c.master != "":
		return nil, usagef("--master goes with --sentinel")
	}
	return redis.NewClient(&redis.Options{Addr: c.addr, DB: c.db, Username: c.user, Password: password}), nil
}

// queue opens the queue. Unless create is set, a queue that does not exist
// is an error (errNoQueue), and nothing is written to Redis. The queue is
// never started.
func (a *app) queue(_ context.Context, create bool) (*delayqueue.DelayQueue, error) {
	client, err := a.conn.client()
	if err != nil {
		return nil, err
	}
	a.client = client
	opts := []delayqueue.Option{delayqueue.WithName(a.conn.queue)}
	if !create {
		// Write nothing to open it: no queue created, no instance number
		// taken on every run (only a push generates IDs).
		opts = append(opts, delayqueue.WithoutInstance())
	}
	a.q, err = delayqueue.New(client, opts...)
	if !create && errors.Is(err, delayqueue.ErrNotFound) {
		return nil, fmt.Errorf("%w %q on this Redis (nothing was created; check --queue)", errNoQueue, a.conn.queue)
	}
	return a.q, err
}

// close closes what queue opened.
func (a *app) close() {
	if a.q != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = a.q.Close(ctx) // never started: nothing to hand over
	}
	if a.client != nil {
		_ = a.client.Close()
	}
}

// serverNow reads the Redis server's clock, on which the queue's times
// are, falling back to this machine's.
func (a *app) serverNow(ctx context.Context) time.Time {
	now, err := a.client.Time(ctx).Result()
	if err != nil {
		return time.Now()
	}
	return now
}
