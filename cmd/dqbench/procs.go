package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// proc is a child process of a layout run, as the parent sees it.
type proc struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	ready chan struct{} // closed at its ready line
	done  chan struct{} // closed once it exited and its output was read

	// Set before done is closed.
	result childResult
	err    error
}

// fleet is the child processes of one run. kill ends those still running;
// every run defers it, so no child outlives a failed run.
type fleet struct {
	procs  []*proc
	got    *receipts
	exited chan *proc // each proc once, when it is done

	mu    sync.Mutex
	spans []span // the handlers' spans the consumers reported (-work)
}

func newFleet(got *receipts) *fleet {
	return &fleet{got: got, exited: make(chan *proc, 256)}
}

// start starts the binary itself as a child in role, with args.
func (f *fleet) start(name, role string, args ...string) (*proc, error) {
	self, err := selfBinary()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, append([]string{roleFlag, role}, args...)...)
	cmd.Args[0] = os.Args[0] // what ps and pgrep show
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, stdin: stdin, ready: make(chan struct{}), done: make(chan struct{})}
	f.procs = append(f.procs, p)
	go f.read(p, stdout)
	return p, nil
}

// selfBinary is the path that starts this very program again. Where there
// is /proc/self/exe, it names the file this process runs even after a new
// build replaced the file at its path, so that every child of a sitting runs
// the same code as its parent.
func selfBinary() (string, error) {
	const procSelf = "/proc/self/exe"
	if _, err := os.Stat(procSelf); err == nil {
		return procSelf, nil
	}
	return os.Executable()
}

// read takes in p's output until it ends, then waits for p to exit.
func (f *fleet) read(p *proc, stdout io.Reader) {
	var errs []error
	haveResult, ready := false, false
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case bytes.HasPrefix(line, []byte(receiptMark)):
			if err := f.got.add(line); err != nil && len(errs) == 0 {
				errs = append(errs, err)
			}
		case bytes.HasPrefix(line, []byte(spanMark)):
			sp, err := parseSpan(line)
			if err != nil && len(errs) == 0 {
				errs = append(errs, err)
			}
			f.mu.Lock()
			f.spans = append(f.spans, sp)
			f.mu.Unlock()
		case string(line) == readyLine && !ready:
			close(p.ready)
			ready = true
		case len(line) > 0 && line[0] == '{':
			if err := json.Unmarshal(line, &p.result); err != nil {
				errs = append(errs, fmt.Errorf("result %q: %w", line, err))
			}
			haveResult = true
		default:
			errs = append(errs, fmt.Errorf("unexpected line %q", line))
		}
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, err)
	}
	if err := p.cmd.Wait(); err != nil {
		errs = append(errs, err)
	}
	switch {
	case p.result.Error != "":
		errs = append(errs, errors.New(p.result.Error))
	case !haveResult:
		errs = append(errs, errors.New("exited without a result"))
	}
	if len(errs) > 0 {
		p.err = fmt.Errorf("%s: %w", p.name, joinErrors(errs))
	}
	close(p.done)
	f.exited <- p
}

// waitReady waits until every child said it is ready.
func (f *fleet) waitReady(ctx context.Context, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for _, p := range f.procs {
		select {
		case <-p.ready:
		case <-p.done:
			select {
			case <-p.ready: // and has done its part since, as a producer does
			default:
				return fmt.Errorf("%s exited before it was ready: %w", p.name, p.err)
			}
		case <-t.C:
			return fmt.Errorf("%s not ready within %v", p.name, timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// stop ends the children's input, which stops them, and waits for all of
// them to exit, at most timeout.
func (f *fleet) stop(ctx context.Context, timeout time.Duration) error {
	for _, p := range f.procs {
		_ = p.stdin.Close()
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	var errs []error
	for _, p := range f.procs {
		select {
		case <-p.done:
			errs = append(errs, p.err)
		case <-t.C:
			return fmt.Errorf("%s did not exit within %v of being stopped", p.name, timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return joinErrors(errs)
}

// kill ends every child still running, and waits until each has exited.
func (f *fleet) kill() {
	for _, p := range f.procs {
		select {
		case <-p.done:
			continue
		default:
		}
		_ = p.stdin.Close()
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// receipts gathers the deliveries that every consumer reported, counting
// each job's first one and its duplicates.
type receipts struct {
	mu       sync.Mutex
	seen     []uint16 // deliveries per job number
	distinct int
	total    int
	lates    []time.Duration // lateness of each job's first delivery
	firsts   []receipt       // each job's first delivery, as it came
	early    int             // deliveries reserved before the job was due
	last     time.Time       // the latest first delivery
	all      chan struct{}   // closed once every job arrived
}

func newReceipts(n int) *receipts {
	return &receipts{seen: make([]uint16, n), lates: make([]time.Duration, 0, n), all: make(chan struct{})}
}

func (r *receipts) add(line []byte) error {
	rc, err := parseReceipt(line)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if rc.job < 0 || rc.job >= len(r.seen) {
		return fmt.Errorf("job number %d out of range", rc.job)
	}
	r.total++
	if rc.early {
		r.early++
	}
	if r.seen[rc.job] < 1<<16-1 {
		r.seen[rc.job]++
	}
	if r.seen[rc.job] > 1 {
		return nil
	}
	r.distinct++
	r.lates = append(r.lates, rc.at.Sub(rc.due))
	r.firsts = append(r.firsts, rc)
	if rc.at.After(r.last) {
		r.last = rc.at
	}
	if r.distinct == len(r.seen) {
		close(r.all)
	}
	return nil
}

// joinErrors joins errors on one line, for messages that end in a table.
func joinErrors(errs []error) error {
	var msgs []string
	for _, err := range errs {
		if err != nil {
			msgs = append(msgs, err.Error())
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return errors.New(strings.Join(msgs, "; "))
}
