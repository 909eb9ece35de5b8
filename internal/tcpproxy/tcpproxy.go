// Package tcpproxy is a loopback TCP relay that tests can cut off and
// restore, to make a server unreachable without stopping it.
package tcpproxy

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
)

// Proxy relays connections from Addr to a target address while it is up.
// While it is down, it accepts connections and closes them at once, and it
// has closed every connection it was relaying.
type Proxy struct {
	Addr   string
	target string
	ln     net.Listener

	mu     sync.Mutex
	up     bool
	conns  map[net.Conn]bool
	stalls map[*atomic.Bool]bool // of the relays running
	wg     sync.WaitGroup
}

// Start listens on a free loopback port and relays to target; up says
// whether it starts relaying at once.
func Start(target string, up bool) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, up: up, conns: map[net.Conn]bool{}, stalls: map[*atomic.Bool]bool{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// SetUp restores (true) or cuts off (false) the relay.
func (p *Proxy) SetUp(up bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.up = up
	if !up {
		for c := range p.conns {
			_ = c.Close()
		}
	}
}

// Stall has the connections relayed so far go silent, as over a link that
// broke without a word: they stay open, and what either side sends is
// dropped. Connections made later are relayed as usual.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := range p.stalls {
		s.Store(true)
	}
}

// Close stops the proxy and waits for its goroutines.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.SetUp(false)
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		p.wg.Add(1)
		go p.relay(c)
	}
}

func (p *Proxy) relay(c net.Conn) {
	defer p.wg.Done()
	if !p.track(c) {
		_ = c.Close()
		return
	}
	defer p.untrack(c)
	s, err := net.Dial("tcp", p.target)
	if err != nil || !p.track(s) {
		_ = c.Close()
		if s != nil {
			_ = s.Close()
		}
		return
	}
	defer p.untrack(s)
	stalled := new(atomic.Bool)
	p.mu.Lock()
	p.stalls[stalled] = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.stalls, stalled)
		p.mu.Unlock()
	}()
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 && !stalled.Load() {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		_ = dst.Close()
		_ = src.Close()
	}
	go pipe(s, c)
	go pipe(c, s)
	wg.Wait()
}

// track registers a connection; it reports false when the proxy is down.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.up {
		return false
	}
	p.conns[c] = true
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
	_ = c.Close()
}
