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

// fileStore puts the local journal (statefile.File) behind the document's
// store contract: Commit is an Apply, and one goroutine waits for each
// record in order and reports it, so done runs in commit order and never
// inside Commit. A File that failed stays failed, as the contract wants.
type fileStore struct {
	f     *statefile.File
	queue chan pendingRecord
	done  chan struct{}
}

type pendingRecord struct {
	seq  uint64
	done func(error)
}

func newFileStore(f *statefile.File) *fileStore {
	s := &fileStore{f: f, queue: make(chan pendingRecord, 1<<16), done: make(chan struct{})}
	go s.report()
	return s
}

func (s *fileStore) report() {
	defer close(s.done)
	for r := range s.queue {
		err := s.f.Wait(context.Background(), r.seq)
		if r.done != nil {
			r.done(err)
		}
	}
}

func (s *fileStore) Load(context.Context) (map[string][]byte, error) { return s.f.Snapshot(), nil }

func (s *fileStore) Commit(ops []desired.Op, done func(error)) {
	sops := make([]statefile.Op, len(ops))
	for i, op := range ops {
		sops[i] = statefile.Op{Key: op.Key, Value: op.Value, Delete: op.Delete}
	}
	s.queue <- pendingRecord{seq: s.f.Apply(sops...), done: done}
}

func (s *fileStore) Journal(key string, value []byte) { s.Commit(journalOps(key, value), nil) }

func (s *fileStore) Healthy() error { return s.f.Healthy() }

func (s *fileStore) Size() int64 { return s.f.Size() }

// Close flushes the journal, reports every record still queued and
// releases the file.
func (s *fileStore) Close() error {
	err := s.f.Close()
	close(s.queue)
	<-s.done
	return err
}
