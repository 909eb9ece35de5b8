// Package flakyconn makes the connections of a go-redis client misbehave as
// a network does, for tests: a reply lost after the command ran, a
// connection that stops answering, a command held back on its way, every
// connection cut at once.
//
// A Dialer plugs into redis.Options.Dialer (or ClusterOptions.Dialer). Each
// rule matches the commands whose bytes, lower-cased, contain a string:
// a script's SHA, say, or "subscribe".
package flakyconn

import (
	"context"
	"net"
	"os"
	"strings"
	"sync"
	"time"
)

// Dialer dials TCP connections that obey its rules.
type Dialer struct {
	mu    sync.Mutex
	rules []*rule
	conns []*conn // every connection dialed, for CutAll
}

type kind int

const (
	loseReply    kind = iota // the next matching command runs; its reply is lost
	stall                    // a connection that sent a matching command never answers again
	hold                     // matching commands wait before they are sent
	loseThenHold             // loseReply for the first matching command, hold for the rest
)

type rule struct {
	kind  kind
	match string
	used  bool          // loseReply, loseThenHold: the command is on its way
	ran   bool          // loseReply, loseThenHold: its reply came, and was thrown away
	gate  chan struct{} // hold, loseThenHold: closed to let commands through
}

// LoseNextReply makes the next command that contains match run on the
// server while its reply is lost: the client's read fails with a timeout,
// as after a network hiccup, and go-redis sends the command again on
// another connection. It reports, once fired, through the returned func:
// fired means the command ran, for its reply came (and was thrown away).
func (d *Dialer) LoseNextReply(match string) (fired func() bool) {
	return d.ran(d.add(&rule{kind: loseReply, match: strings.ToLower(match)}))
}

// ran reports whether a rule's lost reply came.
func (d *Dialer) ran(r *rule) func() bool {
	return func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return r.ran
	}
}

// Stall makes every connection that sends a command containing match stop
// answering: its reads wait for their deadline, then fail with a timeout.
func (d *Dialer) Stall(match string) {
	d.add(&rule{kind: stall, match: strings.ToLower(match)})
}

// LoseNextReplyThenHold makes the next command that contains match run
// with its reply lost, as LoseNextReply does, and the commands that contain
// match after it (the same command sent again) wait before they are sent,
// until release is called: a test acts between a command's first run and
// its second.
func (d *Dialer) LoseNextReplyThenHold(match string) (fired func() bool, release func()) {
	r := d.add(&rule{kind: loseThenHold, match: strings.ToLower(match), gate: make(chan struct{})})
	var once sync.Once
	return d.ran(r), func() { once.Do(func() { close(r.gate) }) }
}

// Hold makes commands containing match wait before they are sent, until
// release is called.
func (d *Dialer) Hold(match string) (release func()) {
	r := d.add(&rule{kind: hold, match: strings.ToLower(match), gate: make(chan struct{})})
	var once sync.Once
	return func() { once.Do(func() { close(r.gate) }) }
}

func (d *Dialer) add(r *rule) *rule {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rules = append(d.rules, r)
	return r
}

// Dial has the signature of redis.Options.Dialer.
func (d *Dialer) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	fc := &conn{Conn: c, d: d, closed: make(chan struct{})}
	d.mu.Lock()
	d.conns = append(d.conns, fc)
	d.mu.Unlock()
	return fc, nil
}

// CutAll closes the network side of every connection dialed so far, as a
// broken network or a server that drops its clients would: the client
// sees its reads and writes fail, and dials again.
func (d *Dialer) CutAll() {
	d.mu.Lock()
	conns := d.conns
	d.conns = nil
	d.mu.Unlock()
	for _, c := range conns {
		_ = c.Conn.Close()
	}
}

type conn struct {
	net.Conn
	d      *Dialer
	closed chan struct{}
	once   sync.Once

	mu       sync.Mutex
	deadline time.Time // for reads
	wdl      time.Time // for writes
	mute     bool      // reads wait for their deadline and time out
	lose     *rule     // the first read takes the reply and throws it away
	lost     bool      // it did: reads time out at once
}

func (c *conn) Write(p []byte) (int, error) {
	cmd := strings.ToLower(string(p))
	var gates []chan struct{}
	c.d.mu.Lock()
	for _, r := range c.d.rules {
		if !strings.Contains(cmd, r.match) {
			continue
		}
		switch r.kind {
		case loseReply:
			if !r.used {
				r.used = true
				c.mu.Lock()
				c.lose = r
				c.mu.Unlock()
			}
		case stall:
			c.mu.Lock()
			c.mute = true
			c.mu.Unlock()
		case hold:
			gates = append(gates, r.gate)
		case loseThenHold:
			if r.used {
				gates = append(gates, r.gate)
				break
			}
			r.used = true
			c.mu.Lock()
			c.lose = r
			c.mu.Unlock()
		}
	}
	c.d.mu.Unlock()
	if len(gates) > 0 {
		c.mu.Lock()
		expired := after(c.wdl)
		c.mu.Unlock()
		for _, g := range gates {
			select {
			case <-g:
			case <-expired:
				return 0, os.ErrDeadlineExceeded
			case <-c.closed:
				return 0, net.ErrClosed
			}
		}
	}
	return c.Conn.Write(p)
}

func (c *conn) Read(p []byte) (int, error) {
	c.mu.Lock()
	lose, lost, mute, deadline := c.lose, c.lost, c.mute, c.deadline
	c.lost = lose != nil
	c.mu.Unlock()
	switch {
	case lost:
		return 0, os.ErrDeadlineExceeded
	case lose != nil:
		// The reply's first bytes say the command ran; whatever the
		// client's deadline, the test waits for that.
		_ = c.Conn.SetReadDeadline(time.Time{})
		if _, err := c.Conn.Read(p); err != nil {
			return 0, err
		}
		c.d.mu.Lock()
		lose.ran = true
		c.d.mu.Unlock()
		return 0, os.ErrDeadlineExceeded
	case mute:
		select {
		case <-after(deadline):
			return 0, os.ErrDeadlineExceeded
		case <-c.closed:
			return 0, net.ErrClosed
		}
	}
	return c.Conn.Read(p)
}

// after fires at a deadline; never for none.
func after(deadline time.Time) <-chan time.Time {
	if deadline.IsZero() {
		return nil
	}
	return time.After(time.Until(deadline))
}

func (c *conn) SetDeadline(t time.Time) error {
	c.setDeadline(&c.deadline, t)
	c.setDeadline(&c.wdl, t)
	return c.Conn.SetDeadline(t)
}

func (c *conn) SetReadDeadline(t time.Time) error {
	c.setDeadline(&c.deadline, t)
	return c.Conn.SetReadDeadline(t)
}

func (c *conn) SetWriteDeadline(t time.Time) error {
	c.setDeadline(&c.wdl, t)
	return c.Conn.SetWriteDeadline(t)
}

// setDeadline records a deadline, for the reads and writes it holds back.
func (c *conn) setDeadline(field *time.Time, t time.Time) {
	c.mu.Lock()
	*field = t
	c.mu.Unlock()
}

func (c *conn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}
