package desired

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/naming"
)

// Regression tests for issue 8 (fencing edge cases, bounded inputs, durable
// before visible, no false FAILED, immutable published values). Each
// failed before the change that introduced it.

func TestNegativeTokensAreOrdinaryTokens(t *testing.T) {
	d := open(t, NewMemoryStore(nil), slots(2))
	id := "z1/kvm.small/000"
	steps := []struct {
		name  string
		id    string
		token Token
		want  ErrCode
	}{
		{"first contact", id, Token{"s", 6, 1}, 0},
		{"stale and negative: fenced, not invalid", id, Token{"s", 6, -1}, CodeFenced},
		{"negative first contact accepted", "z1/kvm.small/001", Token{"s", -5, -5}, 0},
		{"negative but newer accepted", "z1/kvm.small/001", Token{"s", -5, -4}, 0},
		{"negative epoch older", "z1/kvm.small/001", Token{"s", -6, math.MaxInt64}, CodeFenced},
		{"int64 min first contact", "z1/kvm.small/001", Token{"t", math.MinInt64, math.MinInt64}, 0},
	}
	for _, s := range steps {
		if _, err := mut(t, d, Request{Kind: KindCreate, MachineID: s.id, Token: s.token}); code(err) != s.want {
			t.Errorf("%s: %v", s.name, err)
		}
	}
}

func TestBareMetalDeleteFencesFirst(t *testing.T) {
	d, _, err := Open(context.Background(), Options{Store: NewMemoryStore(nil), DefaultInstallation: "inst",
		Now: func() time.Time { return t0 }, VMName: naming.VMName}, slots(1))
	if err != nil {
		t.Fatal(err)
	}
	id := "z1/kvm.small/000"
	if _, err := mut(t, d, Request{Kind: KindDelete, MachineID: id, Token: Token{"s", 1, 5}}); code(err) != CodeUnimplemented {
		t.Fatalf("bare-metal delete: %v", err)
	}
	if _, err := mut(t, d, Request{Kind: KindDelete, MachineID: id, Token: Token{"s", 1, 5}}); code(err) != CodeFenced {
		t.Errorf("stale bare-metal delete: %v", err)
	}
}

func TestFenceKeysAreUnambiguous(t *testing.T) {
	d := open(t, NewMemoryStore(nil), slots(1))
	id := "z1/kvm.small/000"
	mut(t, d, Request{Kind: KindCreate, MachineID: "zz\x00" + id, Token: Token{"A", 1, 1}})
	if _, err := mut(t, d, Request{Kind: KindCreate, MachineID: id, Token: Token{"A\x00zz", 1, 1}}); err != nil {
		t.Errorf("first contact fenced by another pair's mark: %v", err)
	}
	// And the marks survive a restart apart.
	d2 := open(t, NewMemoryStore(snapshot(t, d.opts.Store)), slots(1))
	if _, err := mut(t, d2, Request{Kind: KindCreate, MachineID: id, Token: Token{"A\x00zz", 1, 1}}); code(err) != CodeFenced {
		t.Errorf("after restart: %v", err)
	}
	if _, err := mut(t, d2, Request{Kind: KindCreate, MachineID: "zz\x00" + id, Token: Token{"A", 1, 2}}); code(err) != CodeNotFound {
		t.Errorf("after restart, the other pair: %v", err)
	}
}

func TestFormat1FenceKeysMigrate(t *testing.T) {
	id := "z1/kvm.small/000"
	stored := map[string][]byte{
		keyMeta:                 []byte(`{"version":1,"lineage":"0011223344556677","installation":"inst","next_op":7,"rev":3}`),
		keyFence + "s\x00" + id: []byte(`{"e":4,"s":2}`),
	}
	d := open(t, NewMemoryStore(stored), slots(1))
	if _, err := mut(t, d, Request{Kind: KindCreate, MachineID: id, Token: Token{"s", 4, 2}}); code(err) != CodeFenced {
		t.Errorf("migrated mark does not fence: %v", err)
	}
	after := snapshot(t, d.opts.Store)
	if _, ok := after[keyFence+"s\x00"+id]; ok {
		t.Error("format-1 key kept")
	}
	if _, ok := after[fenceKey{"s", id}.storeKey()]; !ok {
		t.Error("format-2 key missing")
	}
}

func TestCursorlessPagesRotate(t *testing.T) {
	d := open(t, NewMemoryStore(nil), slots(10))
	seen := map[string]bool{}
	for i := 0; i < 3; i++ {
		ms, _ := d.List(map[State]bool{Speculative: true}, 1, nil)
		seen[ms[0].ID] = true
	}
	if len(seen) != 3 {
		t.Errorf("3 cursor-less pages returned %d distinct machines", len(seen))
	}
}

// A paged walk that started at a rotated pivot visits every machine, also
// one mutated while the walk was in its wrapped (lower) part.
func TestWrappedWalkIsComplete(t *testing.T) {
	for start := 0; start < 12; start++ {
		d := open(t, NewMemoryStore(nil), slots(12))
		for i := 0; i < start; i++ {
			d.List(nil, 1, nil) // move the rotor
		}
		seen := map[string]bool{}
		page, cur := d.List(nil, 5, nil)
		for n := 0; len(page) > 0 && n < 50; n++ {
			for _, m := range page {
				seen[m.ID] = true
			}
			if n == 1 {
				// Mutate a machine of the lowest revisions: whatever phase
				// the walk is in, it must still be visited.
				mut(t, d, Request{Kind: KindCreate, MachineID: "z1/kvm.small/000"})
				mut(t, d, Request{Kind: KindCreate, MachineID: "z1/kvm.small/011"})
			}
			page, cur = d.List(nil, 5, cur)
		}
		if len(seen) != 12 {
			t.Errorf("start %d: walk saw %d of 12", start, len(seen))
		}
		// The walk ends on a delta cursor: nothing changed since.
		if ms, _ := d.List(nil, 0, cur); len(ms) != 0 {
			t.Errorf("start %d: %d machines after the walk ended", start, len(ms))
		}
	}
}

func TestIDCapsAndNoEcho(t *testing.T) {
	d := open(t, NewMemoryStore(nil), slots(1))
	id := "z1/kvm.small/000"
	a, _ := mut(t, d, Request{Kind: KindCreate, MachineID: id})
	d.Complete(context.Background(), id, a.OpID, Result{Host: "h"})
	big := strings.Repeat("x", 9<<20)
	for name, r := range map[string]Request{
		"machine":      {Kind: KindCreate, MachineID: big, Token: Token{"s", 1, 1}},
		"shard":        {Kind: KindCreate, MachineID: id, Token: Token{big, 1, 1}},
		"cluster":      {Kind: KindConfigure, MachineID: id, Cluster: big},
		"utf8 machine": {Kind: KindCreate, MachineID: "bad\xff" + big},
		"utf8 shard":   {Kind: KindCreate, MachineID: id, Token: Token{"bad\xff", 1, 1}},
		"utf8 cluster": {Kind: KindConfigure, MachineID: id, Cluster: "bad\xff"},
		"utf8 meta":    {Kind: KindConfigure, MachineID: id, Cluster: "c", Metadata: map[string]string{"k\xff" + strings.Repeat("k", 1000): "v"}},
	} {
		_, err := mut(t, d, r)
		if code(err) != CodeInvalid || len(err.Error()) > 512 {
			t.Errorf("%s: %d bytes of error: %.100v", name, len(fmt.Sprint(err)), err)
		}
	}
	got := 0
	for k := range snapshot(t, d.opts.Store) {
		if !strings.HasPrefix(k, keyHistory) { // the accepted Create's history is expected
			got++
		}
	}
	if got != 2 { // the machine and the header
		t.Errorf("rejected requests left state behind: %d keys", got)
	}
}

func TestFenceMarksPerMachineBounded(t *testing.T) {
	d := open(t, NewMemoryStore(nil), slots(1))
	id := "z1/kvm.small/000"
	for i := 0; i < MaxFencesPerMachine; i++ {
		if _, err := mut(t, d, Request{Kind: KindDrain, MachineID: id, Token: Token{fmt.Sprint("s", i), 1, 1}}); code(err) != CodeConflict {
			t.Fatalf("shard %d: %v", i, err)
		}
	}
	if _, err := mut(t, d, Request{Kind: KindDrain, MachineID: id, Token: Token{"one-more", 1, 1}}); code(err) != CodeExhausted {
		t.Errorf("a shard past the cap: %v", err)
	}
	// Existing marks keep working and keep fencing.
	if _, err := mut(t, d, Request{Kind: KindDrain, MachineID: id, Token: Token{"s0", 1, 1}}); code(err) != CodeFenced {
		t.Errorf("old mark: %v", err)
	}
	if _, err := mut(t, d, Request{Kind: KindCreate, MachineID: id, Token: Token{"s0", 1, 2}}); err != nil {
		t.Errorf("old shard advancing: %v", err)
	}
}

func TestEmptyBlobAndFailedConfigureClearsBinding(t *testing.T) {
	d := open(t, NewMemoryStore(nil), slots(1))
	id := "z1/kvm.small/000"
	a, _ := mut(t, d, Request{Kind: KindCreate, MachineID: id})
	d.Complete(context.Background(), id, a.OpID, Result{Host: "h"})
	c, err := mut(t, d, Request{Kind: KindConfigure, MachineID: id, Cluster: "c", Blob: []byte{}, Metadata: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if b, ok := d.Blob(id, c.OpID); !ok || len(b) != 0 {
		t.Errorf("empty blob: %q %v", b, ok)
	}
	d.Fail(context.Background(), id, c.OpID, "hook failed")
	if m := d.Get(id); len(m.ShardMetadata) != 0 || m.Cluster != "" || m.LastError != "hook failed" {
		t.Errorf("after a failed configure: cluster %q metadata %v error %q", m.Cluster, m.ShardMetadata, m.LastError)
	}
}

func TestFailedCommitIsNeverVisible(t *testing.T) {
	store := NewMemoryStore(nil)
	d := open(t, store, slots(2))
	id := "z1/kvm.small/000"
	before := d.Cursor()
	store.Fail(errors.New("write state.journal: no space left on device"))
	if _, err := mut(t, d, Request{Kind: KindCreate, MachineID: id, Token: Token{"s", 1, 1}}); code(err) != CodeUnavailable {
		t.Fatalf("create on a full disk: %v", err)
	}
	if m := d.Get(id); m.State != Speculative {
		t.Errorf("a change that failed to commit is visible: %v", m.State)
	}
	if ms, _ := d.List(nil, 0, before); len(ms) != 0 {
		t.Errorf("delta shows %d uncommitted machines", len(ms))
	}
	// The document stays failed: no later change can build on the lost one.
	if _, err := mut(t, d, Request{Kind: KindCreate, MachineID: "z1/kvm.small/001"}); code(err) != CodeUnavailable {
		t.Errorf("later create: %v", err)
	}
	if d.Healthy() == nil {
		t.Error("healthy after a failed commit")
	}
}

func TestDrainGraceIsClamped(t *testing.T) {
	d := open(t, NewMemoryStore(nil), slots(1))
	id := "z1/kvm.small/000"
	a, _ := mut(t, d, Request{Kind: KindCreate, MachineID: id})
	d.Complete(context.Background(), id, a.OpID, Result{Host: "h"})
	c, _ := mut(t, d, Request{Kind: KindConfigure, MachineID: id, Cluster: "c"})
	d.Complete(context.Background(), id, c.OpID, Result{})
	dr, err := mut(t, d, Request{Kind: KindDrain, MachineID: id, Grace: math.MaxInt64})
	if err != nil {
		t.Fatal(err)
	}
	in := dr.Machine.Intent
	if in.GraceSeconds != MaxGraceSeconds || in.Deadline.Sub(in.Started) != MaxGraceSeconds*time.Second+defaultDrainMargin {
		t.Errorf("grace %d, deadline %v after start", in.GraceSeconds, in.Deadline.Sub(in.Started))
	}
	if again, err := mut(t, d, Request{Kind: KindDrain, MachineID: id, Grace: math.MaxInt64}); err != nil || again.OpID != dr.OpID {
		t.Errorf("retry: %v %v", err, again.OpID)
	}
}

// Readers see machine values while writers publish new ones. A reader
// notes every value it meets (its full exported content, deeply) the first
// time; at the end each must still hold exactly that content: a published
// value is never written again. This fails without -race too (issue 18:
// it only asserted anything under the race detector); with -race an
// in-place write also shows as a race.
func TestPublishedMachinesAreImmutable(t *testing.T) {
	d := open(t, NewMemoryStore(nil), slots(50))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	seen := map[*Machine][]byte{}
	note := func(m *Machine) {
		if _, ok := seen[m]; ok {
			return
		}
		b, err := json.Marshal(m)
		if err != nil {
			t.Error(err)
		}
		seen[m] = b
	}
	var rounds atomic.Int64 // the reader's completed passes over All
	wg.Add(1)
	go func() {
		defer wg.Done()
		var cur []byte
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, m := range d.All() {
				note(m)
			}
			rounds.Add(1)
			ms, next := d.List(nil, 7, cur)
			for _, m := range ms {
				note(m)
			}
			cur = next
		}
	}()
	// After each change the reader completes a pass, so it meets every
	// value that was ever published, while the writers keep working.
	settle := func() {
		for r := rounds.Load(); rounds.Load() < r+2; {
			runtime.Gosched()
		}
	}
	ctx := context.Background()
	for i := 0; i < 50; i++ {
		id := fmt.Sprintf("z1/kvm.small/%03d", i)
		a, _ := mut(t, d, Request{Kind: KindCreate, MachineID: id})
		settle()
		if i%2 == 0 {
			d.Complete(ctx, id, a.OpID, Result{Host: "h"})
		} else {
			d.Fail(ctx, id, a.OpID, "boom")
		}
		settle()
	}
	close(stop)
	wg.Wait()
	changed := 0
	for m, first := range seen {
		now, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(first, now) {
			if changed++; changed <= 3 {
				t.Errorf("machine %s was changed after it was published:\nfirst seen %s\nnow        %s", m.ID, first, now)
			}
		}
	}
	if len(seen) < 100 {
		t.Errorf("the reader saw only %d machine values; it must see the writers' work", len(seen))
	}
	if changed > 0 {
		t.Errorf("%d of %d published machine values changed", changed, len(seen))
	}
}

func TestExecStartingIsDurableAndSurvivesRestart(t *testing.T) {
	d := open(t, NewMemoryStore(nil), slots(1))
	id := "z1/kvm.small/000"
	a, _ := mut(t, d, Request{Kind: KindCreate, MachineID: id})
	d.Complete(context.Background(), id, a.OpID, Result{Host: "h"})
	c, _ := mut(t, d, Request{Kind: KindConfigure, MachineID: id, Cluster: "c"})
	d.Complete(context.Background(), id, c.OpID, Result{})
	dr, _ := mut(t, d, Request{Kind: KindDrain, MachineID: id})
	if err := d.ExecStarting(context.Background(), id, "op-0", "z/vm/exec-drain"); err == nil {
		t.Error("exec recorded for a transition that is not current")
	}
	if err := d.ExecStarting(context.Background(), id, dr.OpID, "z/vm/exec-drain"); err != nil {
		t.Fatal(err)
	}
	d2 := open(t, NewMemoryStore(snapshot(t, d.opts.Store)), slots(1))
	if diff := cmp.Diff([]string{"z/vm/exec-drain"}, d2.Get(id).Intent.Execs); diff != "" {
		t.Errorf("execs after restart (-want +got):\n%s", diff)
	}
}
