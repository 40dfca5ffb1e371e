package etcdtest

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy forwards TCP connections from a loopback address to a member's
// client address and can stop forwarding without closing anything, the
// way a network partition (or a paused peer) looks to both sides.
type Proxy struct {
	Addr string

	target    string
	l         net.Listener
	blackhole atomic.Bool
	mu        sync.Mutex
	closed    bool
	conns     []net.Conn
	wg        sync.WaitGroup
}

// Proxies starts one Proxy per member; they close when tb ends.
func (c *Cluster) Proxies(tb testing.TB) []*Proxy {
	var ps []*Proxy
	for _, ep := range c.Endpoints() {
		ps = append(ps, NewProxy(tb, ep))
	}
	return ps
}

// NewProxy forwards a fresh loopback address to target until tb ends.
func NewProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{Addr: l.Addr().String(), target: target, l: l}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.close)
	return p
}

// Blackhole drops every byte in both directions from now on; connections
// stay open and new ones are accepted but never reach the member.
func (p *Proxy) Blackhole() { p.blackhole.Store(true) }

// Heal ends a blackhole: every connection open now is closed (what was
// dropped left their streams torn, as after a partition the peers time
// out) and new ones are forwarded again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.blackhole.Store(false)
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.l.Accept()
		if err != nil {
			return
		}
		if !p.track(in) {
			return
		}
		if p.blackhole.Load() {
			p.wg.Add(1)
			go func() { defer p.wg.Done(); p.drop(in) }()
			continue
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		if !p.track(out) {
			in.Close()
			return
		}
		p.wg.Add(2)
		go p.pipe(out, in)
		go p.pipe(in, out)
	}
}

// track records c for close; after close it closes c and says so.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns = append(p.conns, c)
	return true
}

// pipe copies src to dst until either fails; in blackhole mode it keeps
// reading src and discards what it reads.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.blackhole.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			if tcp, ok := dst.(*net.TCPConn); ok && !p.blackhole.Load() {
				tcp.CloseWrite()
			}
			return
		}
	}
}

func (p *Proxy) drop(c net.Conn) {
	io.Copy(io.Discard, c)
}

func (p *Proxy) close() {
	p.l.Close()
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
