package statefile

import (
	"context"
	"fmt"
	"maps"
	"sync"
)

// Memory is a Store that keeps the state only in memory, for runs without
// a state file. Every Apply is immediately "durable": Wait returns at once.
type Memory struct {
	mu         sync.Mutex
	state      map[string][]byte
	lastSeq    uint64
	lastStored uint64
	size       int64
	closed     bool
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
	if m.closed {
		return m.lastSeq
	}
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
	return m.lastSeq
}

// Wait returns nil at once for every applied record, and ErrClosed for
// records applied after Close.
func (m *Memory) Wait(_ context.Context, seq uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case seq > m.lastSeq:
		return fmt.Errorf("wait for record %d: only %d applied", seq, m.lastSeq)
	case seq > m.lastStored:
		return ErrClosed
	}
	return nil
}

// Healthy returns ErrClosed after Close, otherwise nil.
func (m *Memory) Healthy() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	return nil
}

// Size returns the bytes of keys and values held.
func (m *Memory) Size() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.size
}

// Close stops further Applies from taking effect.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}
