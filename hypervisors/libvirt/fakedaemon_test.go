package libvirt

import (
	"encoding/binary"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"
)

// fakeDaemon speaks just enough of libvirt's RPC protocol on a unix socket
// for the connection code: the handshake (auth-list, connect-open), the
// version call the probe makes, event registration, and a "no such
// domain" answer to anything else. Tests make it slow or silent per
// procedure or per connection, and it counts connections and calls, to
// check what the adapter does when a daemon or a connection stops
// answering.
type fakeDaemon struct {
	t    *testing.T
	ln   net.Listener
	path string

	mu sync.Mutex
	// hold: calls of these procedures get no answer until released.
	hold map[uint32]bool
	held []heldCall
	// silence: connections (by accept order, from 1) that get no answer
	// at all from now on (a wedged connection; the daemon is fine).
	silence map[int]bool
	conns   []net.Conn
	wmu     []*sync.Mutex // one writer at a time per connection
	closed  map[int]bool
	// script, when it has a procedure, answers its calls (n counts them
	// from 1); ok false holds the call.
	script map[uint32]func(n int) (status uint32, payload []byte, ok bool)
	// hangUp: after answering a call of one of these procedures the
	// daemon closes the connection.
	hangUp map[uint32]bool
	// inFlight and maxInFlight count held calls per procedure.
	inFlight, maxInFlight map[uint32]int
	calls                 map[uint32]int
	wg                    sync.WaitGroup
}

type heldCall struct {
	conn   int
	proc   uint32
	serial uint32
}

// Procedures the fake knows (go-libvirt's constants are internal).
const (
	procConnectOpen       = 1
	procConnectClose      = 2
	procDomainLookup      = 23
	procAuthList          = 66
	procGetLibVersion     = 157
	procEventRegisterAny  = 316
	procEventDeregistrAny = 317
	procVolDownload       = 209
	procDomainCreate      = 9
	procDomainResume      = 28
	procDomainGetState    = 212
	remoteProgram         = 0x20008086
)

func newFakeDaemon(t *testing.T) *fakeDaemon {
	t.Helper()
	path := filepath.Join(t.TempDir(), "libvirt-sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	d := &fakeDaemon{t: t, ln: ln, path: path, hold: map[uint32]bool{}, hangUp: map[uint32]bool{}, silence: map[int]bool{},
		closed: map[int]bool{}, script: map[uint32]func(int) (uint32, []byte, bool){}, inFlight: map[uint32]int{}, maxInFlight: map[uint32]int{}, calls: map[uint32]int{}}
	d.wg.Add(1)
	go d.accept()
	t.Cleanup(d.close)
	return d
}

// uri is the zone URI that reaches the fake.
func (d *fakeDaemon) uri() string { return "qemu:///system?socket=" + d.path }

func (d *fakeDaemon) close() {
	_ = d.ln.Close()
	d.mu.Lock()
	for _, c := range d.conns {
		_ = c.Close()
	}
	d.mu.Unlock()
	d.wg.Wait()
}

func (d *fakeDaemon) accept() {
	defer d.wg.Done()
	for {
		c, err := d.ln.Accept()
		if err != nil {
			return
		}
		d.mu.Lock()
		d.conns = append(d.conns, c)
		d.wmu = append(d.wmu, new(sync.Mutex))
		n := len(d.conns)
		d.mu.Unlock()
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			d.serve(n, c)
		}()
	}
}

// serve answers one connection until it closes.
func (d *fakeDaemon) serve(n int, c net.Conn) {
	defer func() {
		_ = c.Close()
		d.mu.Lock()
		d.closed[n] = true
		d.mu.Unlock()
	}()
	d.mu.Lock()
	wmu := d.wmu[n-1]
	d.mu.Unlock()
	send := func(proc, typ, serial, status uint32, payload []byte) {
		wmu.Lock()
		defer wmu.Unlock()
		_, _ = c.Write(packet(proc, typ, serial, status, payload))
	}
	reply := func(proc, serial, status uint32, payload []byte) { send(proc, 1, serial, status, payload) }
	for {
		h := make([]byte, 28)
		if _, err := io.ReadFull(c, h); err != nil {
			return
		}
		size := binary.BigEndian.Uint32(h[0:])
		proc, serial := binary.BigEndian.Uint32(h[12:]), binary.BigEndian.Uint32(h[20:])
		if _, err := io.CopyN(io.Discard, c, int64(size)-28); err != nil {
			return
		}
		d.mu.Lock()
		d.calls[proc]++
		silent := d.silence[n]
		held := d.hold[proc]
		scripted, hasScript := d.script[proc]
		hangUp := d.hangUp[proc]
		nth := d.calls[proc]
		if held && !silent {
			d.held = append(d.held, heldCall{n, proc, serial})
			d.inFlight[proc]++
			d.maxInFlight[proc] = max(d.maxInFlight[proc], d.inFlight[proc])
		}
		d.mu.Unlock()
		if silent || held {
			continue
		}
		if hasScript {
			if st, payload, ok := scripted(nth); ok {
				reply(proc, serial, st, payload)
			}
			if hangUp {
				return
			}
			continue
		}
		switch proc {
		case procAuthList:
			reply(proc, serial, 0, []byte{0, 0, 0, 1, 0, 0, 0, 0}) // [AuthNone]
		case procConnectOpen, procConnectClose, procEventDeregistrAny:
			reply(proc, serial, 0, nil)
		case procGetLibVersion:
			reply(proc, serial, 0, []byte{0, 0, 0, 0, 0, 0x89, 0x54, 0x40}) // 9000000
		case procEventRegisterAny:
			reply(proc, serial, 0, []byte{0, 0, 0, 7})
		case procVolDownload:
			// What libvirtd 9.0 sends when its event loop runs the new
			// stream before the worker thread queues the call's reply
			// (seen on the wire and in its debug log under load): the
			// data (two packets here), the end-of-stream marker, then
			// the reply.
			send(proc, 3, serial, 2, make([]byte, 2048)) // STREAM CONTINUE
			send(proc, 3, serial, 2, make([]byte, 2048)) // STREAM CONTINUE
			send(proc, 3, serial, 2, nil)                // STREAM CONTINUE, empty: EOF
			reply(proc, serial, 0, nil)
		default:
			reply(proc, serial, 1, libvirtError(42, "Domain not found"))
		}
		if hangUp {
			return
		}
	}
}

// packet frames one libvirt RPC message of the remote program.
func packet(proc, typ, serial, status uint32, payload []byte) []byte {
	h := make([]byte, 28, 28+len(payload))
	binary.BigEndian.PutUint32(h[0:], uint32(28+len(payload)))
	binary.BigEndian.PutUint32(h[4:], remoteProgram)
	binary.BigEndian.PutUint32(h[8:], 1)
	binary.BigEndian.PutUint32(h[12:], proc)
	binary.BigEndian.PutUint32(h[16:], typ)
	binary.BigEndian.PutUint32(h[20:], serial)
	binary.BigEndian.PutUint32(h[24:], status)
	return append(h, payload...)
}

// libvirtError encodes a remote_error as go-libvirt decodes it.
func libvirtError(code uint32, msg string) []byte {
	b := binary.BigEndian.AppendUint32(nil, code)
	b = binary.BigEndian.AppendUint32(b, 10) // domain
	b = binary.BigEndian.AppendUint32(b, 1)  // message present
	b = binary.BigEndian.AppendUint32(b, uint32(len(msg)))
	b = append(b, msg...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return binary.BigEndian.AppendUint32(b, 2) // level
}

// domainReply encodes a Domain (name, zero UUID, id) as a lookup returns it.
func domainReply(name string, id int32) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(name)))
	b = append(b, name...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	b = append(b, make([]byte, 16)...)
	return binary.BigEndian.AppendUint32(b, uint32(id))
}

// answer scripts the answers to proc's calls.
func (d *fakeDaemon) answer(proc uint32, f func(n int) (status uint32, payload []byte, ok bool)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.script[proc] = f
}

// setHold makes calls of proc wait (on) or answers the waiting ones (off:
// "no such domain", as if the daemon had been slow).
func (d *fakeDaemon) setHold(proc uint32, on bool) {
	d.mu.Lock()
	d.hold[proc] = on
	var release []heldCall
	if !on {
		kept := d.held[:0]
		for _, h := range d.held {
			if h.proc == proc {
				release = append(release, h)
				d.inFlight[proc]--
			} else {
				kept = append(kept, h)
			}
		}
		d.held = kept
	}
	conns := append([]net.Conn(nil), d.conns...)
	wmu := append([]*sync.Mutex(nil), d.wmu...)
	d.mu.Unlock()
	for _, h := range release {
		wmu[h.conn-1].Lock()
		_, _ = conns[h.conn-1].Write(packet(h.proc, 1, h.serial, 1, libvirtError(42, "Domain not found")))
		wmu[h.conn-1].Unlock()
	}
}

// hangUpAfter makes the daemon close each connection right after it
// answers a call of proc (or, when a script holds the call, instead of
// answering).
func (d *fakeDaemon) hangUpAfter(proc uint32) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.hangUp[proc] = true
}

// silenceConn wedges connection n (from 1): it is read but never answered.
func (d *fakeDaemon) silenceConn(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.silence[n] = true
}

// stats returns how many connections were accepted and closed, and the
// most calls of proc that were held at once.
func (d *fakeDaemon) stats(proc uint32) (accepted, closed, maxHeld, calls int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.conns), len(d.closed), d.maxInFlight[proc], d.calls[proc]
}
