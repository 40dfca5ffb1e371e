package server

import (
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/desired"
)

// kindBackend is a memory backend that records whether each batch came
// through Commit or CommitBackground.
type kindBackend struct {
	*desired.MemoryStore
	mu  sync.Mutex
	got []string
}

func (b *kindBackend) Commit(ops []desired.Op, done func(error)) {
	b.mu.Lock()
	b.got = append(b.got, "commit "+ops[0].Key)
	b.mu.Unlock()
	b.MemoryStore.Commit(ops, done)
}

func (b *kindBackend) CommitBackground(ops []desired.Op, done func(error)) {
	b.mu.Lock()
	b.got = append(b.got, "background "+ops[0].Key)
	b.mu.Unlock()
	b.MemoryStore.Commit(ops, done)
}

// TestJournaledBackground: the store a term gives the document (loadOnce
// over journaled) is a desired.BackgroundStore that hands background
// batches, and the simulator world's records, to a backend that can hold
// them (the etcd store), and commits them at once on any other.
func TestJournaledBackground(t *testing.T) {
	b := &kindBackend{MemoryStore: desired.NewMemoryStore(nil)}
	j := journaled{b}
	var doc desired.Store = &loadOnce{stateStore: j} // as openTerm does
	bs, ok := doc.(desired.BackgroundStore)
	if !ok {
		t.Fatal("the document's store is not a desired.BackgroundStore: the document commits the reconciler's records like an RPC's")
	}
	doc.Commit([]desired.Op{{Key: "rpc", Value: []byte("v")}}, nil)
	bs.CommitBackground([]desired.Op{{Key: "complete", Value: []byte("v")}}, nil)
	j.Journal("world", []byte("v"))
	b.mu.Lock()
	got := b.got
	b.mu.Unlock()
	if diff := cmp.Diff([]string{"commit rpc", "background complete", "background world"}, got); diff != "" {
		t.Errorf("batches (-want +got):\n%s", diff)
	}

	// A backend that cannot hold a batch commits it at once.
	m := desired.NewMemoryStore(nil)
	done := make(chan error, 1)
	journaled{m}.CommitBackground([]desired.Op{{Key: "k", Value: []byte("v")}}, func(err error) { done <- err })
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a background batch on a memory backend was never settled")
	}
}
