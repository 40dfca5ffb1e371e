package server

import (
	"context"

	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/statefile"
)

// stateStore is the store the provider runs on: the desired document's
// store, the simulator world's journal (the same queue, so a crash never
// leaves the document ahead of the world) and what metrics and shutdown
// need.
type stateStore interface {
	desired.Store
	Journal(key string, value []byte)
	Size() int64
	Close() error
}

// memoryStore runs without --state.
type memoryStore struct{ *desired.MemoryStore }

func (m memoryStore) Journal(key string, value []byte) { m.Commit(journalOps(key, value), nil) }

func journalOps(key string, value []byte) []desired.Op {
	return []desired.Op{{Key: key, Value: value, Delete: value == nil}}
}

// fileStore puts the local journal (statefile.File, whose Commit and Load
// already keep the contract) behind the document's store interface; only
// the op type differs.
type fileStore struct{ f *statefile.File }

func (s fileStore) Load(ctx context.Context) (map[string][]byte, error) { return s.f.Load(ctx) }

func (s fileStore) Commit(ops []desired.Op, done func(error)) {
	sops := make([]statefile.Op, len(ops))
	for i, op := range ops {
		sops[i] = statefile.Op{Key: op.Key, Value: op.Value, Delete: op.Delete}
	}
	s.f.Commit(sops, done)
}

func (s fileStore) Journal(key string, value []byte) { s.Commit(journalOps(key, value), nil) }

func (s fileStore) Healthy() error { return s.f.Healthy() }

func (s fileStore) Size() int64 { return s.f.Size() }

func (s fileStore) Close() error { return s.f.Close() }
