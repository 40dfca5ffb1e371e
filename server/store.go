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
	backend
	Journal(key string, value []byte)
	// CommitBackground: see desired.BackgroundStore. Every stateStore is
	// one, so whatever wraps it for the document (loadOnce) is one too.
	CommitBackground(ops []desired.Op, done func(error))
}

// backend is a store the provider can run on: in memory (no --state), the
// local journal (statefile.File) or an etcd term's store, each keeping the
// document's store contract as it is.
type backend interface {
	desired.Store
	Size() int64
	Close() error
}

var (
	_ backend = (*desired.MemoryStore)(nil)
	_ backend = (*statefile.File)(nil)
	_ backend = (*etcdstore.Store)(nil)
)

// journaled adds the simulator world's journal to a backend: the world's
// records go through the document's own queue.
type journaled struct{ backend }

var _ desired.BackgroundStore = journaled{}

// Journal queues a world record as a background batch: no RPC waits on
// it (the simulator records what the reconciler did).
func (j journaled) Journal(key string, value []byte) {
	j.CommitBackground([]desired.Op{{Key: key, Value: value, Delete: value == nil}}, nil)
}

// CommitBackground hands a background batch on to a backend that can hold
// it (desired.BackgroundStore: the etcd store); any other commits it at
// once.
func (j journaled) CommitBackground(ops []desired.Op, done func(error)) {
	if bs, ok := j.backend.(desired.BackgroundStore); ok {
		bs.CommitBackground(ops, done)
		return
	}
	j.Commit(ops, done)
}
