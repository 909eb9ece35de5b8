// Package redisproc starts and stops redis-server processes on free
// loopback ports, for the tests (through redistest) and the benchmark
// command.
package redisproc

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
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a running redis-server.
type Server struct {
	Addr string
	Dir  string

	mu   sync.Mutex
	path string
	args []string
	cmd  *exec.Cmd
	exit chan struct{}
}

// Path returns the path of redis-server, or an error when it is not on PATH.
func Path() (string, error) { return exec.LookPath("redis-server") }

// Start starts redis-server from path on a free loopback port, with dir as
// its working directory and config as extra arguments (such as
// "--appendonly", "yes"). It returns once the server answers PING.
func Start(path, dir string, config ...string) (*Server, error) {
	return startOnFreePort(path, dir, func(port string) ([]string, error) {
		return append([]string{
			"--port", port, "--bind", "127.0.0.1",
			"--dir", dir, "--save", "", "--appendonly", "no",
			"--logfile", filepath.Join(dir, "redis.log"),
		}, config...), nil
	})
}

// startOnFreePort starts redis-server with the arguments args gives for a
// free port, trying again when the port was taken in between.
func startOnFreePort(path, dir string, args func(port string) ([]string, error)) (*Server, error) {
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		a, err := args(strconv.Itoa(port))
		if err != nil {
			return nil, err
		}
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Dir: dir, path: path, args: a}
		if lastErr = s.launch(); lastErr == nil {
			return s, nil
		}
	}
	return nil, lastErr
}

func (s *Server) launch() error {
	cmd := exec.Command(s.path, s.args...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redisproc: start redis-server: %w", err)
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
			return fmt.Errorf("redisproc: redis-server on %s not ready: %w (log: %s)", s.Addr, err, s.log())
		}
		select {
		case <-exit:
			return fmt.Errorf("redisproc: redis-server on %s exited (log: %s)", s.Addr, s.log())
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

// Signal sends sig to the server process (SIGKILL, SIGSTOP, SIGCONT).
func (s *Server) Signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return errors.New("redisproc: server not running")
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

// Stop ends the server.
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
		return 0, fmt.Errorf("redisproc: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
