// Package redistest starts real redis-server processes for tests, each on a
// free loopback port with its own temporary directory.
//
// When redis-server is not on PATH the tests that need it are skipped, with
// a message on stderr; with DQ_REQUIRE_REDIS=1 they fail instead.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RequireEnv names the variable that turns a missing redis-server into a
// test failure.
const RequireEnv = "DQ_REQUIRE_REDIS"

// Server is a redis-server process started for tests.
type Server struct {
	Addr string
	Dir  string

	mu   sync.Mutex
	path string
	args []string
	cmd  *exec.Cmd
	exit chan struct{}
}

var warnOnce sync.Once

// binary returns redis-server's path, or skips (fails under DQ_REQUIRE_REDIS=1).
func binary(tb testing.TB) string {
	tb.Helper()
	path, err := exec.LookPath("redis-server")
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
	s, err := start(binary(tb), tb.TempDir(), config)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	return s
}

var shared struct {
	once sync.Once
	srv  *Server
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
			shared.srv, shared.err = start(path, shared.dir, nil)
		}
	})
	if shared.err != nil {
		tb.Fatal(shared.err)
	}
	return shared.srv
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

func start(path, dir string, config []string) (*Server, error) {
	var lastErr error
	for range 5 { // a free port can be taken between finding and binding it
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s := &Server{
			Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			Dir:  dir,
			path: path,
			args: append([]string{
				"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
				"--dir", dir, "--save", "", "--appendonly", "no",
				"--logfile", filepath.Join(dir, "redis.log"),
			}, config...),
		}
		if lastErr = s.launch(); lastErr == nil {
			return s, nil
		}
	}
	return nil, lastErr
}

func (s *Server) launch() error {
	cmd := exec.Command(s.path, s.args...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: start redis-server: %w", err)
	}
	exit := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exit)
	}()
	s.mu.Lock()
	s.cmd, s.exit = cmd, exit
	s.mu.Unlock()
	if err := s.waitReady(exit); err != nil {
		s.Stop()
		return err
	}
	return nil
}

// waitReady waits until the server answers PING, or fails when it exits or
// does not answer within 10 seconds.
func (s *Server) waitReady(exit <-chan struct{}) error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: redis-server on %s not ready: %w (log: %s)", s.Addr, err, s.log())
		}
		select {
		case <-exit:
			return fmt.Errorf("redistest: redis-server on %s exited (log: %s)", s.Addr, s.log())
		case <-tick.C:
		}
	}
}

func (s *Server) log() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Client returns a client of the server, closed when the test ends.
func (s *Server) Client(tb testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Signal sends sig to the server process (SIGKILL, SIGSTOP, SIGCONT).
func (s *Server) Signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return errors.New("redistest: server not running")
	}
	return s.cmd.Process.Signal(sig)
}

// Kill ends the server with SIGKILL and waits for it to exit.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, exit := s.cmd, s.exit
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exit
}

// Stop ends the server; it is what Start registers as cleanup.
func (s *Server) Stop() { s.Kill() }

// Restart starts the server again on the same port and directory, after
// Kill, keeping what it had persisted.
func (s *Server) Restart() error {
	s.Kill()
	return s.launch()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("redistest: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
