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

	"github.com/dqueue/delayqueue/internal/redisproc"
	"github.com/redis/go-redis/v9"
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

// StopShared stops the server started by Shared, if any. Call it from
// TestMain after m.Run.
func StopShared() {
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
