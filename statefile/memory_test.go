package statefile

import (
	"context"
	"fmt"
	"maps"
	"sync"
)

// Memory is the model File is held against in the tests: a Store that
// keeps the state only in memory. Every Apply and Commit is "durable" at once: Wait returns
// at once, and Commit's callback follows as soon as a goroutine of the
// store runs it. It enforces the same per-record limit as File.
type Memory struct {
	mu         sync.Mutex
	state      map[string][]byte
	lastSeq    uint64
	lastStored uint64
	size       int64
	err        error // sticky failure: an oversized Commit
	closed     bool
	callbacks  serial
}

// NewMemory returns a Memory store starting from a copy of initial, which
// may be nil.
func NewMemory(initial map[string][]byte) *Memory {
	m := &Memory{state: make(map[string][]byte, len(initial))}
	for k, v := range initial {
		m.state[k] = cloneValue(v)
		m.size += int64(len(k) + len(v))
	}
	return m
}

// Snapshot returns a copy of the current state. Values are shared and must
// not be modified.
func (m *Memory) Snapshot() map[string][]byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.state)
}

// Load returns a copy of the state; ErrClosed after Close. Values are
// shared and must not be modified.
func (m *Memory) Load(ctx context.Context) (map[string][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("load state: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.stopErr(); err != nil {
		return nil, err
	}
	return maps.Clone(m.state), nil
}

// Commit applies ops atomically and returns; done, if not nil, is called
// exactly once, never from inside Commit, one at a time and in Commit
// order: nil if the ops were applied; the sticky failure or ErrClosed if
// not. A record over 256 MiB is not applied and stops the store, as it
// would stop a File. done must not call Close.
func (m *Memory) Commit(ops []Op, done func(error)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopErr() == nil && len(ops) > 0 {
		if n := recordSize(ops); n > maxRecord {
			m.err = fmt.Errorf("state in memory failed: commit a record of %d bytes: over the %d-byte limit", n, maxRecord)
		}
	}
	err := m.stopErr()
	if err == nil && len(ops) > 0 {
		m.lastSeq++
		m.applyLocked(ops)
	}
	if done != nil {
		m.callbacks.post(func() { done(err) })
	}
}

// stopErr is the error batches get once the store stopped. Callers hold
// m.mu.
func (m *Memory) stopErr() error {
	switch {
	case m.err != nil:
		return m.err
	case m.closed:
		return ErrClosed
	}
	return nil
}

// Apply applies ops atomically and returns their sequence number. With no
// ops it returns the latest sequence number. After Close it applies
// nothing.
func (m *Memory) Apply(ops ...Op) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(ops) == 0 {
		return m.lastSeq
	}
	m.lastSeq++
	if m.stopErr() != nil {
		return m.lastSeq
	}
	m.applyLocked(ops)
	return m.lastSeq
}

// applyLocked applies ops as record m.lastSeq. Callers hold m.mu.
func (m *Memory) applyLocked(ops []Op) {
	for _, op := range ops {
		if old, ok := m.state[op.Key]; ok {
			m.size -= int64(len(op.Key) + len(old))
		}
		if op.Delete {
			delete(m.state, op.Key)
			continue
		}
		m.state[op.Key] = cloneValue(op.Value)
		m.size += int64(len(op.Key) + len(op.Value))
	}
	m.lastStored = m.lastSeq
}

// Wait returns nil at once for every applied record, the sticky failure
// after one, and ErrClosed for records applied after Close.
func (m *Memory) Wait(_ context.Context, seq uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.err != nil:
		return m.err
	case seq > m.lastSeq:
		return fmt.Errorf("wait for record %d: only %d applied", seq, m.lastSeq)
	case seq > m.lastStored:
		return ErrClosed
	}
	return nil
}

// Healthy returns the sticky failure, ErrClosed after Close, otherwise
// nil.
func (m *Memory) Healthy() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stopErr()
}

// Size returns the bytes of keys and values held.
func (m *Memory) Size() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.size
}

// Close stops further Applies and Commits from taking effect and returns
// once the callbacks of every Commit before it have run. Commits after
// Close still get their callback (ErrClosed), on a goroutine that exits
// when it has none left to run.
func (m *Memory) Close() error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.callbacks.wait()
	return nil
}
