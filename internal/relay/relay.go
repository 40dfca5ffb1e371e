package relay

import (
	"fmt"
	"io"
	"net"
	"sync"
)

// Relay forwards 127.0.0.1:Port() to a target.
type Relay struct {
	target string
	addr   string

	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]bool
	frozen bool
	thaw   chan struct{}
	wg     sync.WaitGroup
}

// New starts a relay on a free loopback port.
func New(target string) (*Relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("relay listen: %w", err)
	}
	r := &Relay{target: target, addr: ln.Addr().String(), conns: map[net.Conn]bool{}, thaw: make(chan struct{})}
	r.serve(ln)
	return r, nil
}

// Addr is the relay's listening address (stable across Cut and Restore).
func (r *Relay) Addr() string { return r.addr }

// Port is the relay's port.
func (r *Relay) Port() string {
	_, p, _ := net.SplitHostPort(r.addr)
	return p
}

func (r *Relay) serve(ln net.Listener) {
	r.mu.Lock()
	r.ln = ln
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.wg.Add(1)
			go func() { defer r.wg.Done(); r.pipe(c) }()
		}
	}()
}

func (r *Relay) track(c net.Conn, on bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if on && r.ln == nil {
		return false
	}
	if on {
		r.conns[c] = true
	} else {
		delete(r.conns, c)
	}
	return true
}

func (r *Relay) pipe(in net.Conn) {
	out, err := net.Dial("tcp", r.target)
	if err != nil {
		in.Close()
		return
	}
	if !r.track(in, true) || !r.track(out, true) {
		in.Close()
		out.Close()
		return
	}
	var wg sync.WaitGroup
	copyHalf := func(dst, src net.Conn) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				r.waitThaw()
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		// Either side ending ends both.
		in.Close()
		out.Close()
	}
	wg.Add(2)
	go copyHalf(out, in)
	go copyHalf(in, out)
	wg.Wait()
	r.track(in, false)
	r.track(out, false)
}

// waitThaw blocks while the relay is frozen.
func (r *Relay) waitThaw() {
	r.mu.Lock()
	frozen, thaw := r.frozen, r.thaw
	r.mu.Unlock()
	if frozen {
		<-thaw
	}
}

// Cut closes the listener and every relayed connection: new connections
// are refused until Restore.
func (r *Relay) Cut() {
	r.mu.Lock()
	ln := r.ln
	r.ln = nil
	conns := r.conns
	r.conns = map[net.Conn]bool{}
	r.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	for c := range conns {
		c.Close()
	}
	r.Thaw()
}

// Freeze stops forwarding bytes; connections stay open and new ones are
// accepted (and stall).
func (r *Relay) Freeze() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.frozen {
		r.frozen, r.thaw = true, make(chan struct{})
	}
}

// Thaw resumes forwarding after Freeze.
func (r *Relay) Thaw() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.frozen {
		r.frozen = false
		close(r.thaw)
	}
}

// Restore listens again on the same address after Cut.
func (r *Relay) Restore() error {
	r.mu.Lock()
	up := r.ln != nil
	r.mu.Unlock()
	if up {
		return nil
	}
	ln, err := net.Listen("tcp", r.addr)
	if err != nil {
		return fmt.Errorf("relay re-listen on %s: %w", r.addr, err)
	}
	r.serve(ln)
	return nil
}

// Close cuts the relay for good and waits for its goroutines.
func (r *Relay) Close() error {
	r.Cut()
	r.wg.Wait()
	return nil
}

var _ io.Closer = (*Relay)(nil)
