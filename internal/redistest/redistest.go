// Package redistest starts real redis-server processes for tests, each on a
// free loopback port with its own temporary directory.
//
// When redis-server is not on PATH the tests that need it are skipped, with
// a message on stderr; with DQ_REQUIRE_REDIS=1 they fail instead.
package redistest

import (
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/dqueue/delayqueue/internal/redisproc"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// RequireEnv names the variable that turns a missing redis-server into a
// test failure.
const RequireEnv = "DQ_REQUIRE_REDIS"

// Server is a redis-server started for tests.
type Server struct{ *redisproc.Server }

var warnOnce sync.Once

// binary returns redis-server's path, or skips (fails under DQ_REQUIRE_REDIS=1).
func binary(tb testing.TB) string {
	tb.Helper()
	path, err := redisproc.Path()
	if err == nil {
		return path
	}
	if os.Getenv(RequireEnv) == "1" {
		tb.Fatalf("redis-server is not on PATH and %s=1: install it (apt-get install redis-server)", RequireEnv)
	}
	warnOnce.Do(func() {
		fmt.Fprintf(os.Stderr, "\n*** redis-server not on PATH: SKIPPING every real-Redis test. "+
			"Install redis-server, or set %s=1 to make this a failure. ***\n\n", RequireEnv)
	})
	tb.Skip("redis-server not on PATH")
	return ""
}

// Start starts a redis-server for this test and stops it when the test ends.
// config holds extra redis-server arguments, such as "--appendonly", "yes".
func Start(tb testing.TB, config ...string) *Server {
	tb.Helper()
	s, err := redisproc.Start(binary(tb), tb.TempDir(), config...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	return &Server{s}
}

var shared struct {
	once sync.Once
	srv  *redisproc.Server
	dir  string
	err  error

	clusterOnce sync.Once
	cluster     *redisproc.Cluster
	clusterErr  error
}

// Shared returns one redis-server shared by all tests of the test binary;
// tests keep apart by using their own key names. StopShared ends it.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	path := binary(tb)
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "redistest-")
		if shared.err == nil {
			shared.srv, shared.err = redisproc.Start(path, shared.dir)
		}
	})
	if shared.err != nil {
		tb.Fatal(shared.err)
	}
	return &Server{shared.srv}
}

// SharedCluster returns one 3-master Redis Cluster shared by all tests of the
// test binary. StopShared ends it.
func SharedCluster(tb testing.TB) *redisproc.Cluster {
	tb.Helper()
	path := binary(tb)
	shared.clusterOnce.Do(func() {
		var dir string
		dir, shared.clusterErr = os.MkdirTemp("", "redistest-cluster-")
		if shared.clusterErr == nil {
			shared.cluster, shared.clusterErr = redisproc.StartCluster(path, dir, 3, 0)
		}
	})
	if shared.clusterErr != nil {
		tb.Fatal(shared.clusterErr)
	}
	return shared.cluster
}

// StartCluster starts a Redis Cluster of masters masters with replicas
// replicas each for this test, and stops it when the test ends.
func StartCluster(tb testing.TB, masters, replicas int) *redisproc.Cluster {
	tb.Helper()
	c, err := redisproc.StartCluster(binary(tb), tb.TempDir(), masters, replicas)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Stop)
	return c
}

// StartSentinels starts a primary, two replicas and three sentinels for this
// test, and stops them when the test ends.
func StartSentinels(tb testing.TB) *redisproc.Sentinels {
	tb.Helper()
	s, err := redisproc.StartSentinels(binary(tb), tb.TempDir(), 2, 3)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// ClusterClient returns a client of a cluster, closed when the test ends.
func ClusterClient(tb testing.TB, c *redisproc.Cluster) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	tb.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Run is a TestMain's body: it runs the tests, stops the shared servers,
// and when the tests passed, fails the run for any goroutine left behind.
// It returns the exit code.
func Run(m *testing.M) int {
	code := m.Run()
	StopShared()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left behind:", err)
			code = 1
		}
	}
	return code
}

// ForEach runs f against an embedded miniredis and the shared real
// redis-server, each as a subtest.
func ForEach(t *testing.T, f func(t *testing.T, c redis.UniversalClient)) {
	t.Run("miniredis", func(t *testing.T) {
		m := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		f(t, c)
	})
	t.Run("redis", func(t *testing.T) {
		f(t, Shared(t).Client(t))
	})
}

// StopShared stops the servers started by Shared and SharedCluster, if any.
// Call it from TestMain after m.Run.
func StopShared() {
	if shared.cluster != nil {
		shared.cluster.Stop()
	}
	if shared.srv != nil {
		shared.srv.Stop()
	}
	if shared.dir != "" {
		_ = os.RemoveAll(shared.dir)
	}
}

// Client returns a client of the server, closed when the test ends.
func (s *Server) Client(tb testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}
