package server

import (
	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/etcdstore"
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

// fileStore is the local journal (statefile.File, which keeps the
// document's store contract as it is) plus the simulator world's journal.
type fileStore struct{ *statefile.File }

var (
	_ desired.Store = (*statefile.File)(nil)
	_ desired.Store = (*etcdstore.Store)(nil)
)

func (s fileStore) Journal(key string, value []byte) { s.Commit(journalOps(key, value), nil) }
