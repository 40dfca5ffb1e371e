package service

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"weak"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/desired"
)

// Bounds of the encoded List answers waiting for their readers. A reader
// that does not read (it grants no HTTP/2 flow-control window) keeps its
// answer's bytes queued in the transport; those bytes are counted here
// from the moment the answer is encoded until gRPC is done with them
// (sent, the stream reset, or the connection closed: see ConnClosed), and
// a List whose answer would pass the bound is refused with
// ResourceExhausted.
const (
	// MinListBytes is the least the bound is.
	MinListBytes = 16 << 20
	// ListBytesFullAnswers is how many full answers of the current fleet
	// the bound holds at least (a million machines answer ~115 MB).
	ListBytesFullAnswers = 2
	// smallList is a max_results at or below which an answer is small
	// enough to be served even when the bound is full.
	smallList = 64
)

// answers keeps the accounting of the encoded List answers alive, and the
// newest full answer (no filter, no cursor, no cap) while any reader
// holds it: every full List of the same document at the same revision
// shares that one encoding, and concurrent ones wait for the one being
// built, so any number of concurrent or stalled full Lists cost one
// answer.
//
// Invariant: held is the sum of the sizes of the encodings with refs > 0
// (each counted once, however many calls share it) that are not small;
// an answer is counted only if it fits under the bound, or if nothing
// else is held.
type answers struct {
	mu       sync.Mutex
	held     int64
	full     *encoded
	fullSize int64 // size of the newest full answer built
	// conns holds the handouts not yet given back, by the connection
	// (remote address) their call came on.
	conns map[string]map[*handout]struct{}
	// limit, when set (tests), replaces the computed bound.
	limit int64

	// stash hands an answer from the handler to the codec under the
	// identity of the message the handler returned; an answer that never
	// reaches the codec is given back when its message is collected.
	stash sync.Map // weak.Pointer[pb.MachineList] → *handout
}

// encoded is one List answer: the message and its wire encoding.
type encoded struct {
	doc   *desired.Document
	full  bool
	rev   []byte          // a full answer's cursor, known before it is built
	msg   *pb.MachineList // shared by every call; never modified
	data  []byte
	size  int64 // what it counts against the bound
	refs  int   // under answers.mu
	small bool  // below gRPC's pooling threshold: not counted
	// ready is closed once msg and data are built (or err says why they
	// never will be); concurrent full Lists of one revision wait for the
	// one that builds the answer instead of building their own.
	ready chan struct{}
	err   error
}

// bound is what the answers alive may hold together. Callers hold a.mu.
func (a *answers) bound() int64 {
	if a.limit > 0 {
		return a.limit
	}
	return max(MinListBytes, ListBytesFullAnswers*a.fullSize)
}

// exhausted is the refusal of a List whose answer does not fit.
func exhausted(held, need, limit int64) error {
	what := "this one needs more"
	if need > 0 {
		what = fmt.Sprintf("this one needs %d", need)
	}
	return status.Errorf(codes.ResourceExhausted,
		"List answers that readers have not read yet hold %d bytes and %s; the bound is %d (read the answers you asked for, and retry)", held, what, limit)
}

// room refuses at once, before anything is listed, when the bound is
// full: then only a small answer could still be served.
func (a *answers) room() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if limit := a.bound(); a.held >= limit {
		return exhausted(a.held, 0, limit)
	}
	return nil
}

// fullAnswer returns the full answer of doc at revision cursor with a
// reference taken, building it from list (which returns the machines and
// the cursor of the revision it listed) unless another call has it or is
// building it: then this one waits for that one.
func (a *answers) fullAnswer(ctx context.Context, doc *desired.Document, cursor []byte, list func() ([]*desired.Machine, []byte), wire func(*desired.Machine) *wireMachine) (*encoded, error) {
	a.mu.Lock()
	if e := a.full; e != nil && e.doc == doc && bytes.Equal(e.rev, cursor) {
		e.refs++
		a.mu.Unlock()
		select {
		case <-e.ready:
		case <-ctx.Done():
			a.release(e)
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		if e.err != nil {
			a.release(e)
			return nil, e.err
		}
		return e, nil
	}
	if limit := a.bound(); a.held >= limit {
		defer a.mu.Unlock()
		return nil, exhausted(a.held, 0, limit)
	}
	e := &encoded{doc: doc, full: true, rev: cursor, refs: 1, ready: make(chan struct{}), small: true}
	a.full = e
	a.mu.Unlock()
	ms, next := list()
	if !bytes.Equal(next, cursor) {
		// The document moved on between the two reads: this answer is of
		// a newer revision, and later calls at that revision share it.
		a.mu.Lock()
		e.rev = next
		a.mu.Unlock()
	}
	if err := a.fill(e, ms, next, wire); err != nil {
		e.err = err
		close(e.ready)
		a.release(e)
		return nil, err
	}
	close(e.ready)
	return e, nil
}

// add encodes the answer of ms and next, within the bound, and returns it
// with a reference taken.
func (a *answers) add(doc *desired.Document, ms []*desired.Machine, next []byte, wire func(*desired.Machine) *wireMachine) (*encoded, error) {
	e := &encoded{doc: doc, refs: 1, small: true}
	if err := a.fill(e, ms, next, wire); err != nil {
		return nil, err
	}
	return e, nil
}

// fill counts e's encoding against the bound (or refuses it) and builds
// it.
func (a *answers) fill(e *encoded, ms []*desired.Machine, next []byte, wire func(*desired.Machine) *wireMachine) error {
	n := len(next) + 12
	for _, m := range ms {
		n += len(wire(m).entry())
	}
	small := mem.IsBelowBufferPoolingThreshold(n)
	a.mu.Lock()
	if e.full {
		a.fullSize = int64(n)
	}
	if !small {
		if limit := a.bound(); a.held > 0 && a.held+int64(n) > limit {
			held := a.held
			a.mu.Unlock()
			return exhausted(held, int64(n), limit)
		}
		a.held += int64(n)
	}
	a.mu.Unlock()
	msg := &pb.MachineList{Machines: make([]*pb.Machine, len(ms)), Revision: next}
	data := make([]byte, 0, n)
	for i, m := range ms {
		w := wire(m)
		msg.Machines[i] = w.msg
		data = append(data, w.entry()...)
	}
	if len(next) > 0 {
		data = protowire.AppendTag(data, revisionField, protowire.BytesType)
		data = protowire.AppendBytes(data, next)
	}
	a.mu.Lock()
	e.msg, e.data, e.small, e.size = msg, data, small, int64(n)
	a.mu.Unlock()
	return nil
}

// release drops one reference; the last one gives the bytes back.
func (a *answers) release(e *encoded) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e.refs--
	switch {
	case e.refs > 0:
		return
	case e.refs < 0:
		panic(fmt.Sprintf("List answer released %d times too often", -e.refs))
	}
	if !e.small {
		a.held -= e.size
	}
	if a.full == e {
		a.full = nil
	}
}

// Held returns the bytes of List answers waiting for their readers.
func (a *answers) Held() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held
}

// handout is one call's reference to an answer: given back once, when
// gRPC frees the buffer it sent (mem.BufferPool.Put), when the call's
// connection closes (gRPC does not free what it queued for a connection
// that died), or when the message never reached the codec.
type handout struct {
	a    *answers
	e    *encoded
	conn string
	done atomic.Bool
}

func (h *handout) giveBack() {
	if !h.done.CompareAndSwap(false, true) {
		return
	}
	a := h.a
	a.mu.Lock()
	if set := a.conns[h.conn]; set != nil {
		delete(set, h)
		if len(set) == 0 {
			delete(a.conns, h.conn)
		}
	}
	a.mu.Unlock()
	a.release(h.e)
}

// Get and Put make a handout the mem.BufferPool of its buffer.
func (h *handout) Get(length int) *[]byte { b := make([]byte, length); return &b }
func (h *handout) Put(*[]byte)            { h.giveBack() }

// connOf names the connection a call came on.
func connOf(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// hand returns a message of its own for one call of e (sharing e's
// machines), under which the codec finds the call's reference.
func (a *answers) hand(ctx context.Context, e *encoded) *pb.MachineList {
	h := &handout{a: a, e: e, conn: connOf(ctx)}
	if h.conn != "" {
		a.mu.Lock()
		if a.conns == nil {
			a.conns = map[string]map[*handout]struct{}{}
		}
		set := a.conns[h.conn]
		if set == nil {
			set = map[*handout]struct{}{}
			a.conns[h.conn] = set
		}
		set[h] = struct{}{}
		a.mu.Unlock()
	}
	out := &pb.MachineList{Machines: e.msg.Machines, Revision: e.msg.Revision}
	key := weak.Make(out)
	a.stash.Store(key, h)
	runtime.AddCleanup(out, func(k weak.Pointer[pb.MachineList]) {
		if v, ok := a.stash.LoadAndDelete(k); ok {
			v.(*handout).giveBack()
		}
	}, key)
	return out
}

// take returns the call's reference handed out as l, if l is still
// exactly that answer (no interceptor changed it); the caller owns it.
// An answer l no longer matches is given back.
func (a *answers) take(l *pb.MachineList) *handout {
	v, ok := a.stash.LoadAndDelete(weak.Make(l))
	if !ok {
		return nil
	}
	h := v.(*handout)
	e := h.e
	same := len(l.Machines) == len(e.msg.Machines) && bytes.Equal(l.Revision, e.msg.Revision) &&
		len(l.ProtoReflect().GetUnknown()) == 0
	for i := 0; same && i < len(l.Machines); i++ {
		same = l.Machines[i] == e.msg.Machines[i]
	}
	if !same {
		h.giveBack()
		return nil
	}
	return h
}

// buffer is h's encoding for gRPC to send; gRPC frees it once sent.
func (a *answers) buffer(h *handout) mem.Buffer {
	if h.e.small {
		defer h.giveBack()
		return mem.SliceBuffer(h.e.data)
	}
	return mem.NewBuffer(&h.e.data, h)
}

// connClosed gives back every reference of the calls that came on conn.
func (a *answers) connClosed(conn string) {
	a.mu.Lock()
	var hs []*handout
	for h := range a.conns[conn] {
		hs = append(hs, h)
	}
	a.mu.Unlock()
	for _, h := range hs {
		h.giveBack()
	}
}
