// Package tcpproxy is a loopback TCP relay that tests can cut off and
// restore, to make a server unreachable without stopping it.
package tcpproxy

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy relays connections from Addr to a target address while it is up.
// While it is down, it accepts connections and closes them at once, and it
// has closed every connection it was relaying.
type Proxy struct {
	Addr   string
	target string
	ln     net.Listener
	delay  atomic.Int64 // one-way, in ns: see SetDelay

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

// SetDelay has what the relay passes on, either way, arrive d later than
// it would, as over a longer link: a round trip takes 2d more. Bytes keep
// their order; what is on its way when the delay changes keeps the delay
// it had.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

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
		// Chunks go through a queue to a writer, which sends each once
		// its delay is over; without a delay, at once.
		type chunk struct {
			b  []byte
			at time.Time
		}
		queue := make(chan chunk, 1024)
		written := make(chan struct{})
		go func() {
			defer close(written)
			for c := range queue {
				if d := time.Until(c.at); d > 0 {
					time.Sleep(d)
				}
				if stalled.Load() {
					continue
				}
				if _, err := dst.Write(c.b); err != nil {
					_ = src.Close() // the reader stops too
					break
				}
			}
			for range queue { // drained, so the reader never blocks
			}
		}()
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				queue <- chunk{b: buf[:n], at: time.Now().Add(time.Duration(p.delay.Load()))}
			}
			if err != nil {
				break
			}
		}
		close(queue)
		<-written
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
