package desired

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/naming"
)

// recordingStore is a MemoryStore that records the size of every batch
// and can fail every batch after the first n.
type recordingStore struct {
	*MemoryStore
	mu      sync.Mutex
	sizes   []int
	failAt  int // fail batches from this index on; 0: never
	failErr error
}

func (s *recordingStore) Commit(ops []Op, done func(error)) {
	s.mu.Lock()
	n := 0
	for _, op := range ops {
		n += len(op.Key) + len(op.Value)
	}
	s.sizes = append(s.sizes, n)
	fail := s.failAt > 0 && len(s.sizes) > s.failAt
	s.mu.Unlock()
	if fail {
		s.MemoryStore.Fail(s.failErr)
	}
	s.MemoryStore.Commit(ops, done)
}

func bigSlots(n int) []Slot {
	out := slots(n)
	for i := range out {
		out[i].Labels = map[string]string{"team": strings.Repeat("l", 200)}
	}
	return out
}

// TestOpenSplitsItsFirstCommit (issue 17, item 3): the first commit of a
// large fleet was one record (292 MB for a million slots, over the
// journal's 256 MiB record limit), so a million slots could not start
// with --state. It is now records of at most maxOpenRecordBytes, and a
// crash between them leaves a document the next Open completes.
func TestOpenSplitsItsFirstCommit(t *testing.T) {
	old := maxOpenRecordBytes
	maxOpenRecordBytes = 64 << 10
	t.Cleanup(func() { maxOpenRecordBytes = old })
	const n = 2000
	opts := func(s Store) Options {
		return Options{Store: s, DefaultInstallation: "inst", DeleteSupported: true, Now: func() time.Time { return t0 }, VMName: naming.VMName}
	}
	store := &recordingStore{MemoryStore: NewMemoryStore(nil)}
	d, rep, err := Open(context.Background(), opts(store), bigSlots(n))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Added != n || d.Len() != n {
		t.Fatalf("added %d, holds %d, want %d", rep.Added, d.Len(), n)
	}
	total := 0
	for _, size := range store.sizes {
		if size > maxOpenRecordBytes+4096 {
			t.Errorf("a record of %d bytes, over the %d limit", size, maxOpenRecordBytes)
		}
		total += size
	}
	if len(store.sizes) < total/maxOpenRecordBytes {
		t.Errorf("%d records for %d bytes", len(store.sizes), total)
	}
	// Everything is visible and loads back the same.
	again, _, err := Open(context.Background(), opts(NewMemoryStore(snapshot(t, store))), bigSlots(n))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(revIDs(d.All()), revIDs(again.All())); diff != "" {
		t.Errorf("reloaded (-first +again):\n%s", diff)
	}

	// A crash after three records: those machines are there, the next
	// Open adds the rest.
	crashed := &recordingStore{MemoryStore: NewMemoryStore(nil), failAt: 3, failErr: errors.New("disk gone")}
	if _, _, err := Open(context.Background(), opts(crashed), bigSlots(n)); err == nil {
		t.Fatal("Open on a store that failed mid-way succeeded")
	}
	partial := snapshot(t, crashed)
	machines := 0
	for k := range partial {
		if strings.HasPrefix(k, keyMachine) {
			machines++
		}
	}
	if machines == 0 || machines >= n {
		t.Fatalf("%d machines after a crash mid-way, want some", machines)
	}
	resumed, rep, err := Open(context.Background(), opts(NewMemoryStore(partial)), bigSlots(n))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Added != n-machines || resumed.Len() != n {
		t.Errorf("after the crash: added %d, holds %d; want %d added, %d", rep.Added, resumed.Len(), n-machines, n)
	}
	if resumed.Revision() < uint64(n) {
		t.Errorf("revision %d after %d machines", resumed.Revision(), n)
	}
}

func revIDs(ms []*Machine) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = fmt.Sprintf("%s@%d", m.ID, m.Rev)
	}
	return out
}
