package desired

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/naming"
	"github.com/bigfleet-vm/provider/statefile"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func slots(n int) []Slot {
	out := make([]Slot, n)
	for i := range out {
		out[i] = Slot{ID: fmt.Sprintf("z1/kvm.small/%03d", i), Zone: "z1", InstanceType: "kvm.small", Capacity: OnDemand,
			VCPU: 2, MemoryMiB: 4096, Price: 0.0092, Resources: map[string]string{"cpu": "1", "memory": "2Gi"}}
	}
	return out
}

func open(t testing.TB, store Store, s []Slot) *Document {
	t.Helper()
	d, _, err := Open(context.Background(), Options{Store: store, DefaultInstallation: "inst", DeleteSupported: true,
		Now: func() time.Time { return t0 }, VMName: naming.VMName}, s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func mut(t testing.TB, d *Document, r Request) (Ack, error) {
	t.Helper()
	return d.Mutate(context.Background(), r)
}

func code(err error) ErrCode {
	if e, ok := err.(*Error); ok {
		return e.Code
	}
	if err != nil {
		return -1
	}
	return 0
}

func TestLifecycleAndIdempotency(t *testing.T) {
	d := open(t, NewMemoryStore(nil), slots(2))
	id := "z1/kvm.small/000"
	a1, err := mut(t, d, Request{Kind: KindCreate, MachineID: id})
	if err != nil || a1.Machine.State != Creating || a1.OpID == "" {
		t.Fatalf("create: %v %+v", err, a1)
	}
	a2, _ := mut(t, d, Request{Kind: KindCreate, MachineID: id})
	if a2.OpID != a1.OpID {
		t.Fatalf("retry got %s, want %s", a2.OpID, a1.OpID)
	}
	if ok, _ := d.Complete(context.Background(), id, a1.OpID, Result{Host: "z1/vm"}); !ok {
		t.Fatal("complete discarded")
	}
	a3, _ := mut(t, d, Request{Kind: KindCreate, MachineID: id})
	if a3.OpID != a1.OpID || a3.Machine.State != Idle {
		t.Fatalf("create on IDLE: %+v", a3)
	}
	c1, err := mut(t, d, Request{Kind: KindConfigure, MachineID: id, Cluster: "c1", Blob: []byte("secret"), Metadata: map[string]string{"k": "v"}})
	if err != nil || c1.Machine.Cluster != "c1" || c1.Machine.ShardMetadata["k"] != "v" {
		t.Fatalf("configure: %v %+v", err, c1)
	}
	if _, err := mut(t, d, Request{Kind: KindConfigure, MachineID: id, Cluster: "c2", Blob: []byte("secret")}); code(err) != CodeConflict {
		t.Fatalf("conflicting configure: %v", err)
	}
	if b, ok := d.Blob(id, c1.OpID); !ok || string(b) != "secret" {
		t.Fatal("blob not kept in memory")
	}
	d.Complete(context.Background(), id, c1.OpID, Result{})
	if _, err := mut(t, d, Request{Kind: KindDrain, MachineID: id, Grace: -1}); code(err) != CodeInvalid {
		t.Fatalf("negative grace: %v", err)
	}
	dr, _ := mut(t, d, Request{Kind: KindDrain, MachineID: id, Grace: 30})
	d.Complete(context.Background(), id, dr.OpID, Result{})
	m := d.Get(id)
	if m.State != Idle || m.Cluster != "" || m.ShardMetadata != nil {
		t.Fatalf("after drain: %+v", m)
	}
	if again, _ := mut(t, d, Request{Kind: KindDrain, MachineID: id, Grace: 30}); again.OpID != dr.OpID {
		t.Fatal("drain retry on IDLE must return the drain op")
	}
	del, _ := mut(t, d, Request{Kind: KindDelete, MachineID: id})
	d.Complete(context.Background(), id, del.OpID, Result{})
	m = d.Get(id)
	if m.State != Speculative || m.Host != "" {
		t.Fatalf("after delete: %+v", m)
	}
	a4, _ := mut(t, d, Request{Kind: KindCreate, MachineID: id})
	seen := map[string]bool{a1.OpID: true, c1.OpID: true, dr.OpID: true, del.OpID: true}
	if seen[a4.OpID] {
		t.Fatalf("op id %s reused", a4.OpID)
	}
	if a4.Machine.VMName == a1.Machine.VMName {
		t.Fatal("a new cycle must get a new VM name")
	}
}

func TestOutOfPosition(t *testing.T) {
	d := open(t, NewMemoryStore(nil), slots(1))
	id := "z1/kvm.small/000"
	for _, k := range []Kind{KindConfigure, KindDrain} {
		if _, err := mut(t, d, Request{Kind: k, MachineID: id, Cluster: "c"}); code(err) != CodeConflict {
			t.Errorf("%s on SPECULATIVE: %v", k, err)
		}
	}
	if a, err := mut(t, d, Request{Kind: KindDelete, MachineID: id}); err != nil || a.OpID == "" || a.Machine.State != Speculative {
		t.Errorf("delete on SPECULATIVE should be a no-op with an op id: %v %+v", err, a)
	}
	if _, err := mut(t, d, Request{Kind: KindCreate, MachineID: "nope"}); code(err) != CodeNotFound {
		t.Errorf("unknown id: %v", err)
	}
	if _, err := mut(t, d, Request{Kind: KindCreate}); code(err) != CodeInvalid {
		t.Errorf("empty id: %v", err)
	}
	a, _ := mut(t, d, Request{Kind: KindCreate, MachineID: id})
	d.Fail(context.Background(), id, a.OpID, "boom")
	for _, k := range []Kind{KindCreate, KindConfigure, KindDrain, KindDelete} {
		_, err := mut(t, d, Request{Kind: k, MachineID: id, Cluster: "c"})
		if code(err) != CodeConflict {
			t.Errorf("%s on FAILED: %v", k, err)
		}
	}
	if got := d.Get(id).LastError; got != "boom" {
		t.Errorf("last_error %q", got)
	}
	// A late completion after FAILED is discarded.
	if ok, _ := d.Complete(context.Background(), id, a.OpID, Result{}); ok {
		t.Error("late success applied after FAILED")
	}
}

func TestFencing(t *testing.T) {
	d := open(t, NewMemoryStore(nil), slots(2))
	id, other := "z1/kvm.small/000", "z1/kvm.small/001"
	tok := func(s string, e, q int64) Token { return Token{Shard: s, Epoch: e, Seq: q} }
	steps := []struct {
		name string
		req  Request
		want ErrCode
	}{
		{"first contact", Request{Kind: KindCreate, MachineID: id, Token: tok("a", 1, 5)}, 0},
		{"same token is stale", Request{Kind: KindCreate, MachineID: id, Token: tok("a", 1, 5)}, CodeFenced},
		{"older seq", Request{Kind: KindCreate, MachineID: id, Token: tok("a", 1, 4)}, CodeFenced},
		{"fence before not-found for unknown machine", Request{Kind: KindCreate, MachineID: "nope", Token: tok("a", 1, 1)}, CodeNotFound},
		{"mark kept for an unknown machine", Request{Kind: KindCreate, MachineID: "nope", Token: tok("a", 1, 1)}, CodeFenced},
		{"newer seq passes, then out of position", Request{Kind: KindConfigure, MachineID: id, Token: tok("a", 1, 6), Cluster: "c"}, CodeConflict},
		{"mark advanced by rejected op", Request{Kind: KindCreate, MachineID: id, Token: tok("a", 1, 6)}, CodeFenced},
		{"fence before argument checks", Request{Kind: KindDrain, MachineID: id, Token: tok("a", 1, 6), Grace: -1}, CodeFenced},
		{"higher epoch any seq", Request{Kind: KindCreate, MachineID: id, Token: tok("a", 2, 0)}, 0},
		{"other shard isolated", Request{Kind: KindCreate, MachineID: id, Token: tok("b", 0, 1)}, 0},
		{"other machine isolated", Request{Kind: KindCreate, MachineID: other, Token: tok("a", 0, 1)}, 0},
		{"zero token unfenced", Request{Kind: KindCreate, MachineID: id}, 0},
		{"negative epoch is older", Request{Kind: KindCreate, MachineID: id, Token: tok("a", -1, 1)}, CodeFenced},
		{"int64 max", Request{Kind: KindCreate, MachineID: id, Token: tok("a", math.MaxInt64, math.MaxInt64)}, 0},
		{"after max nothing is newer", Request{Kind: KindCreate, MachineID: id, Token: tok("a", math.MaxInt64, math.MaxInt64)}, CodeFenced},
	}
	for _, s := range steps {
		_, err := mut(t, d, s.req)
		if got := code(err); got != s.want {
			t.Errorf("%s: code %d (%v), want %d", s.name, got, err, s.want)
		}
	}
}

func TestListPagingAndDeltas(t *testing.T) {
	d := open(t, NewMemoryStore(nil), slots(50))
	seen := map[string]int{}
	var cursor []byte
	for page := 0; page < 100; page++ {
		ms, next := d.List(nil, 7, cursor)
		if len(ms) == 0 {
			break
		}
		for _, m := range ms {
			seen[m.ID]++
		}
		cursor = next
		if page == 2 {
			// A mutation mid-walk is seen again later, never lost.
			mut(t, d, Request{Kind: KindCreate, MachineID: "z1/kvm.small/000"})
		}
	}
	if len(seen) != 50 {
		t.Fatalf("paging saw %d machines, want 50", len(seen))
	}
	ms, rev := d.List(nil, 0, cursor)
	if len(ms) != 0 {
		t.Fatalf("nothing changed, delta has %d", len(ms))
	}
	mut(t, d, Request{Kind: KindCreate, MachineID: "z1/kvm.small/007"})
	ms, _ = d.List(nil, 0, rev)
	if diff := cmp.Diff([]string{"z1/kvm.small/007"}, ids(ms)); diff != "" {
		t.Fatalf("delta (-want +got):\n%s", diff)
	}
	ms, _ = d.List(map[State]bool{Creating: true}, 0, nil)
	if len(ms) != 2 {
		t.Fatalf("states filter: %d", len(ms))
	}
	// A cursor it cannot read is no cursor: the full list. The damaged
	// one has its last byte changed (not set to 'x', which left the
	// cursor whole whenever its checksum happened to end in 'x': 1 run
	// in 256).
	damaged := bytes.Clone(rev)
	damaged[len(damaged)-1] ^= 0xff
	for _, c := range [][]byte{nil, []byte("garbage"), damaged, rev[:5]} {
		if ms, _ := d.List(nil, 0, c); len(ms) != 50 {
			t.Errorf("cursor %q: %d machines, want the full 50", c, len(ms))
		}
	}
}

func ids(ms []*Machine) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

func TestRestartRecovery(t *testing.T) {
	mem := NewMemoryStore(nil)
	d := open(t, mem, slots(4))
	ctx := context.Background()
	cr, _ := mut(t, d, Request{Kind: KindCreate, MachineID: "z1/kvm.small/000", Token: Token{Shard: "s", Epoch: 1, Seq: 1}})
	c2, _ := mut(t, d, Request{Kind: KindCreate, MachineID: "z1/kvm.small/001"})
	d.Complete(ctx, "z1/kvm.small/001", c2.OpID, Result{Host: "z1/x"})
	cf, _ := mut(t, d, Request{Kind: KindConfigure, MachineID: "z1/kvm.small/001", Cluster: "c", Blob: []byte("b")})
	rev := d.Revision()

	// Restart with the offering shrunk to 3 slots: 003 (SPECULATIVE) goes.
	d2 := open(t, NewMemoryStore(snapshot(t, mem)), slots(3))
	if d2.Get("z1/kvm.small/003") != nil {
		t.Error("removed speculative slot survived")
	}
	if m := d2.Get("z1/kvm.small/000"); m.State != Creating || m.Intent.OpID != cr.OpID {
		t.Errorf("create not re-driven: %+v", m)
	}
	// The Configure is re-driven too (its blob is not: the guest's record
	// of the hook, or the blob staged in the guest, finishes it).
	if m := d2.Get("z1/kvm.small/001"); m.State != Configuring || m.Intent.OpID != cf.OpID || m.LastError != "" {
		t.Errorf("interrupted configure not re-driven: %+v", m)
	}
	if _, ok := d2.Blob("z1/kvm.small/001", cf.OpID); ok {
		t.Error("the blob survived a restart")
	}
	if got := d2.Pending(); len(got) != 2 {
		t.Errorf("pending %v", got)
	}
	if _, err := mut(t, d2, Request{Kind: KindCreate, MachineID: "z1/kvm.small/000", Token: Token{Shard: "s", Epoch: 1, Seq: 1}}); code(err) != CodeFenced {
		t.Errorf("fence mark lost: %v", err)
	}
	a, _ := mut(t, d2, Request{Kind: KindCreate, MachineID: "z1/kvm.small/000"})
	if a.OpID != cr.OpID {
		t.Errorf("idempotency lost: %s vs %s", a.OpID, cr.OpID)
	}
	n, _ := mut(t, d2, Request{Kind: KindCreate, MachineID: "z1/kvm.small/002"})
	for _, old := range []string{cr.OpID, c2.OpID, cf.OpID} {
		if n.OpID == old {
			t.Errorf("op id %s reused after restart", old)
		}
	}
	if d2.Revision() <= rev {
		t.Errorf("revision went back: %d <= %d", d2.Revision(), rev)
	}
	if d2.Installation() != "inst" {
		t.Errorf("installation %q", d2.Installation())
	}
}

func TestShrinkKeepsOwnedMachine(t *testing.T) {
	mem := NewMemoryStore(nil)
	d := open(t, mem, slots(2))
	a, _ := mut(t, d, Request{Kind: KindCreate, MachineID: "z1/kvm.small/001"})
	d.Complete(context.Background(), "z1/kvm.small/001", a.OpID, Result{Host: "z1/vm"})
	d2 := open(t, NewMemoryStore(snapshot(t, mem)), slots(1))
	m := d2.Get("z1/kvm.small/001")
	if m == nil || m.State != Idle || !m.Slotless {
		t.Fatalf("slotless machine: %+v", m)
	}
	del, err := mut(t, d2, Request{Kind: KindDelete, MachineID: m.ID})
	if err != nil {
		t.Fatal(err)
	}
	d2.Complete(context.Background(), m.ID, del.OpID, Result{})
	if d2.Get(m.ID) != nil {
		t.Fatal("a deleted slotless machine must disappear")
	}
}

func TestCaps(t *testing.T) {
	d := open(t, NewMemoryStore(nil), slots(1))
	id := "z1/kvm.small/000"
	a, _ := mut(t, d, Request{Kind: KindCreate, MachineID: id})
	d.Complete(context.Background(), id, a.OpID, Result{Host: "h"})
	big := map[string]string{}
	for i := 0; i <= MaxMetadataEntries; i++ {
		big[fmt.Sprint(i)] = ""
	}
	for name, r := range map[string]Request{
		"blob":       {Kind: KindConfigure, MachineID: id, Cluster: "c", Blob: make([]byte, MaxBlobBytes+1)},
		"entries":    {Kind: KindConfigure, MachineID: id, Cluster: "c", Metadata: big},
		"bytes":      {Kind: KindConfigure, MachineID: id, Cluster: "c", Metadata: map[string]string{"k": string(make([]byte, MaxMetadataBytes))}},
		"no cluster": {Kind: KindConfigure, MachineID: id},
	} {
		if _, err := mut(t, d, r); code(err) != CodeInvalid {
			t.Errorf("%s: %v", name, err)
		}
	}
	if d.Get(id).State != Idle {
		t.Fatal("rejected configure changed the machine")
	}
	md := map[string]string{"nul\x00": "\x00\x01", "ünï": "", "": "empty key"}
	c, err := mut(t, d, Request{Kind: KindConfigure, MachineID: id, Cluster: "c", Metadata: md})
	if err != nil {
		t.Fatal(err)
	}
	md["nul\x00"] = "changed by caller"
	if c.Machine.ShardMetadata["nul\x00"] != "\x00\x01" {
		t.Fatal("stored metadata aliases the caller's map")
	}
}

func BenchmarkMutateDurable(b *testing.B) {
	dir := b.TempDir()
	f, err := statefile.Open(dir+"/state", statefile.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	d := open(b, fileStore(f), slots(100000))
	b.ResetTimer()
	b.SetParallelism(8) // 16 clients on 2 cores
	var next atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n := next.Add(1)
			i := int(n % 100000)
			d.Mutate(context.Background(), Request{Kind: KindCreate, MachineID: fmt.Sprintf("z1/kvm.small/%03d", i), Token: Token{Shard: "s", Epoch: 1, Seq: int64(n)}})
		}
	})
}

func BenchmarkListFull100k(b *testing.B) {
	d := open(b, NewMemoryStore(nil), slots(100000))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d.List(nil, 0, nil)
	}
}

func BenchmarkListDelta20(b *testing.B) {
	d := open(b, NewMemoryStore(nil), slots(100000))
	rev := d.Cursor()
	for i := 0; i < 20; i++ {
		mut(b, d, Request{Kind: KindCreate, MachineID: fmt.Sprintf("z1/kvm.small/%03d", i*97)})
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if ms, _ := d.List(nil, 0, rev); len(ms) != 20 {
			b.Fatal(len(ms))
		}
	}
}

func TestUnknownFenceMarksAreBounded(t *testing.T) {
	d := open(t, NewMemoryStore(nil), slots(1))
	tok := Token{Shard: "s", Epoch: 1, Seq: 1}
	for i := 0; i < MaxUnknownFences; i++ {
		if _, err := mut(t, d, Request{Kind: KindCreate, MachineID: fmt.Sprintf("ghost-%d", i), Token: tok}); code(err) != CodeNotFound {
			t.Fatalf("ghost %d: %v", i, err)
		}
	}
	// Past the budget a new first contact is refused; no mark is dropped.
	if _, err := mut(t, d, Request{Kind: KindCreate, MachineID: "ghost-new", Token: tok}); code(err) != CodeExhausted {
		t.Errorf("first contact past the budget: %v", err)
	}
	if _, err := mut(t, d, Request{Kind: KindCreate, MachineID: "ghost-0", Token: tok}); code(err) != CodeFenced {
		t.Errorf("the oldest mark must still fence: %v", err)
	}
	// Known machines have their own budget.
	if _, err := mut(t, d, Request{Kind: KindCreate, MachineID: "z1/kvm.small/000", Token: tok}); err != nil {
		t.Errorf("a known machine's first contact: %v", err)
	}
}

// After a restart a Configure has its intent but not its blob; a retry of
// the same Configure hands the blob back (committed like any change), and
// a retry with another blob is still a conflict.
func TestConfigureRetryBringsBlobBackAfterRestart(t *testing.T) {
	mem := NewMemoryStore(nil)
	d := open(t, mem, slots(1))
	ctx := context.Background()
	id := "z1/kvm.small/000"
	c, _ := mut(t, d, Request{Kind: KindCreate, MachineID: id})
	d.Complete(ctx, id, c.OpID, Result{Host: "z1/x"})
	req := Request{Kind: KindConfigure, MachineID: id, Cluster: "c", Blob: []byte("secret"), Metadata: map[string]string{"k": "v"}}
	cf, err := mut(t, d, req)
	if err != nil {
		t.Fatal(err)
	}
	mem2 := NewMemoryStore(snapshot(t, mem))
	d2 := open(t, mem2, slots(1))
	if _, ok := d2.Blob(id, cf.OpID); ok {
		t.Fatal("the blob survived a restart")
	}
	other := req
	other.Blob = []byte("another")
	if _, err := mut(t, d2, other); code(err) != CodeConflict {
		t.Errorf("retry with another blob: %v", err)
	}
	a, err := mut(t, d2, req)
	if err != nil || a.OpID != cf.OpID {
		t.Fatalf("retry: %v %v, want the original op %s", a.OpID, err, cf.OpID)
	}
	if b, ok := d2.Blob(id, cf.OpID); !ok || string(b) != "secret" {
		t.Errorf("blob after the retry: %q %v", b, ok)
	}
	if m := d2.Get(id); m.State != Configuring || m.Cluster != "c" {
		t.Errorf("machine after the retry: %v %q", m.State, m.Cluster)
	}
	for k, v := range snapshot(t, mem2) {
		if bytes.Contains(v, []byte("secret")) {
			t.Errorf("the blob reached the store under %s", k)
		}
	}
}
