package desired

import (
	"context"
	"errors"
	"maps"
	"sync"

	"github.com/bigfleet-vm/provider/kv"
)

// Op is one change to a Store: Value under Key, or the deletion of Key.
// Every store takes it as it is (package kv).
type Op = kv.Op

// Store is where the document's changes become durable: the local journal
// (package statefile), etcd (package etcdstore) or memory. The document is
// its only writer while it is open.
type Store interface {
	// Load returns every committed key/value pair. The document calls it
	// once, before its first Commit, and does not modify the values.
	Load(ctx context.Context) (map[string][]byte, error)
	// Commit queues ops as one atomic batch and returns without waiting.
	// done, if not nil, is called exactly once, never from inside Commit,
	// by the store, one call at a time and in Commit order: with nil once the
	// batch is durable, or with an error once it is not known to be. A
	// store that fails a batch fails every later batch too: it stays
	// failed (the local journal after a failed write or fsync, an etcd
	// store whose leadership term ended).
	Commit(ops []Op, done func(error))
	// Healthy returns the error that stopped the store, nil while it works.
	Healthy() error
}

// BackgroundStore is a Store that may hold a background batch (one no
// RPC's answer waits on: the reconciler's records) for a moment before
// writing it, so that an RPC's batch committed meanwhile shares its write
// instead of waiting behind it (etcdstore: Options.Linger). The document
// commits through CommitBackground what the reconciler records (Complete,
// Fail, ExecStarting...) and through Commit every mutation an RPC
// acknowledges. CommitBackground keeps Commit's contract: one atomic
// batch, done once, in the order of every Commit and CommitBackground.
type BackgroundStore interface {
	Store
	CommitBackground(ops []Op, done func(error))
}

// ErrStoreClosed is what a MemoryStore reports for batches committed after
// Close.
var ErrStoreClosed = errors.New("state store is closed")

// MemoryStore is a Store that keeps everything in memory: runs without
// --state, offline planning and tests. Batches are "durable" at once; done
// still runs on the store's own goroutine, in order, as the contract says.
type MemoryStore struct {
	mu     sync.Mutex
	state  map[string][]byte
	size   int64
	queue  []func()
	wake   chan struct{}
	closed bool
	held   bool // Hold: done callbacks wait for Release (or Close)
	err    error
	done   chan struct{}
}

// NewMemoryStore returns a store holding a copy of initial (which may be
// nil).
func NewMemoryStore(initial map[string][]byte) *MemoryStore {
	s := &MemoryStore{state: make(map[string][]byte, len(initial)), wake: make(chan struct{}, 1), done: make(chan struct{})}
	for k, v := range initial {
		s.state[k] = append([]byte(nil), v...)
		s.size += int64(len(k) + len(v))
	}
	go s.dispatch()
	return s
}

// Load returns a copy of the state.
func (s *MemoryStore) Load(context.Context) (map[string][]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.state), nil
}

// Commit applies ops at once and queues done for the dispatcher.
func (s *MemoryStore) Commit(ops []Op, done func(error)) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		if done != nil {
			go done(ErrStoreClosed) // the dispatcher is gone
		}
		return
	}
	err := s.err
	if err == nil {
		for _, op := range ops {
			if old, ok := s.state[op.Key]; ok {
				s.size -= int64(len(op.Key) + len(old))
			}
			if op.Delete {
				delete(s.state, op.Key)
				continue
			}
			s.state[op.Key] = append([]byte(nil), op.Value...)
			s.size += int64(len(op.Key) + len(op.Value))
		}
	}
	if done != nil {
		s.queue = append(s.queue, func() { done(err) })
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *MemoryStore) dispatch() {
	defer close(s.done)
	for {
		s.mu.Lock()
		var q []func()
		if !s.held || s.closed {
			q, s.queue = s.queue, nil
		}
		closed := s.closed
		s.mu.Unlock()
		for _, f := range q {
			f()
		}
		if closed && len(q) == 0 {
			return
		}
		if len(q) == 0 {
			<-s.wake
		}
	}
}

// Fail makes the store fail every batch from now on, as a full disk
// would; for tests of what readers see when commits fail.
func (s *MemoryStore) Fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
}

// Hold keeps every batch committed from now on (and those not yet
// called back) in flight: applied, but with done not yet called, as a
// slow disk would, until Release or Close; for tests of what readers see
// while a change is on its way.
func (s *MemoryStore) Hold() {
	s.mu.Lock()
	s.held = true
	s.mu.Unlock()
}

// Release ends a Hold: the held callbacks run, in order.
func (s *MemoryStore) Release() {
	s.mu.Lock()
	s.held = false
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Healthy returns the injected failure, ErrStoreClosed after Close, or nil.
func (s *MemoryStore) Healthy() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	if s.closed {
		return ErrStoreClosed
	}
	return nil
}

// Size returns the bytes of keys and values held.
func (s *MemoryStore) Size() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.size
}

// Close runs the callbacks already queued and fails later batches.
func (s *MemoryStore) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	<-s.done
	return nil
}
