package desired

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// kindStore is a MemoryStore that records, per batch, whether it came
// through Commit ("rpc") or CommitBackground ("background") and the
// machine keys it held.
type kindStore struct {
	*MemoryStore
	mu  sync.Mutex
	got []string
}

func (s *kindStore) record(kind string, ops []Op) {
	var keys []string
	for _, op := range ops {
		if strings.HasPrefix(op.Key, keyMachine) {
			keys = append(keys, strings.TrimPrefix(op.Key, keyMachine))
		}
	}
	s.mu.Lock()
	s.got = append(s.got, kind+" "+strings.Join(keys, ","))
	s.mu.Unlock()
}

func (s *kindStore) Commit(ops []Op, done func(error)) {
	s.record("rpc", ops)
	s.MemoryStore.Commit(ops, done)
}

func (s *kindStore) CommitBackground(ops []Op, done func(error)) {
	s.record("background", ops)
	s.MemoryStore.Commit(ops, done)
}

// TestBackgroundCommits: on a BackgroundStore the reconciler's records
// (ExecStarting, Complete, Fail, Adopt) go through CommitBackground, which
// a store may hold for a moment, and every mutation an RPC acknowledges
// through Commit, which it never holds.
func TestBackgroundCommits(t *testing.T) {
	st := &kindStore{MemoryStore: NewMemoryStore(nil)}
	d := open(t, st, slots(3))
	ctx := context.Background()
	st.mu.Lock()
	st.got = nil // the first write of the fleet
	st.mu.Unlock()
	a, b, c := "z1/kvm.small/000", "z1/kvm.small/001", "z1/kvm.small/002"
	ca, err := mut(t, d, Request{Kind: KindCreate, MachineID: a})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.ExecStarting(ctx, a, ca.OpID, "exec-bootstrap"); err != nil {
		t.Fatal(err)
	}
	if ok, err := d.Complete(ctx, a, ca.OpID, Result{Host: "z1/h1"}); !ok || err != nil {
		t.Fatalf("complete: %t %v", ok, err)
	}
	cb, err := mut(t, d, Request{Kind: KindCreate, MachineID: b})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := d.Fail(ctx, b, cb.OpID, "no room"); !ok || err != nil {
		t.Fatalf("fail: %t %v", ok, err)
	}
	if ok, err := d.Adopt(ctx, Adoption{MachineID: c, Zone: "z1", Host: "z1/h1", VMName: "vm-c"}); !ok || err != nil {
		t.Fatalf("adopt: %t %v", ok, err)
	}
	want := []string{"rpc " + a, "background " + a, "background " + a, "rpc " + b, "background " + b, "background " + c}
	st.mu.Lock()
	defer st.mu.Unlock()
	if diff := cmp.Diff(want, st.got); diff != "" {
		t.Errorf("batches (-want +got):\n%s", diff)
	}
}
