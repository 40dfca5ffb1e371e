package desired

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/naming"
	"github.com/bigfleet-vm/provider/statefile"
)

// TestRecoveryNeverReissuesOpIDsOrReacceptsTokens (issue 17, item 2): a
// flipped bit in the journal's last frame used to be truncated as a torn
// write, and the lost Create's op id was issued again and its fencing token
// accepted again. Now the journal refuses to open; an explicit recovery
// drops the frame, but the op-id counter comes back from the mark (no op
// id is reissued), every epoch accepted before the loss is refused, and
// List cursors from before are void (a new lineage).
func TestRecoveryNeverReissuesOpIDsOrReacceptsTokens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	fileOpts := func(recover bool) statefile.Options {
		return statefile.Options{Pinned: Pinned, LossKey: LossKey, Recover: recover, CompactBytes: -1}
	}
	openDoc := func(t *testing.T, f *statefile.File) (*Document, LoadReport) {
		t.Helper()
		d, rep, err := Open(context.Background(), Options{Store: f, DefaultInstallation: "inst", DeleteSupported: true,
			Now: func() time.Time { return t0 }, VMName: naming.VMName}, slots(3))
		if err != nil {
			t.Fatal(err)
		}
		return d, rep
	}
	a, b := "z1/kvm.small/000", "z1/kvm.small/001"
	f, err := statefile.Open(path, fileOpts(false))
	if err != nil {
		t.Fatal(err)
	}
	d, _ := openDoc(t, f)
	if ack, err := mut(t, d, Request{Kind: KindCreate, MachineID: a, Token: Token{"s", 1, 1}}); err != nil || ack.OpID != "op-1" {
		t.Fatalf("create a: %v %v", ack.OpID, err)
	}
	lineage := d.Lineage()
	if ack, err := mut(t, d, Request{Kind: KindCreate, MachineID: b, Token: Token{"s", 1, 2}}); err != nil || ack.OpID != "op-2" {
		t.Fatalf("create b: %v %v", ack.OpID, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	// One bit of the last frame (Create b, acknowledged) flips.
	journal := path + ".journal"
	raw, err := os.ReadFile(journal)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)-1] ^= 0x04
	if err := os.WriteFile(journal, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	var ce *statefile.CorruptError
	if _, err := statefile.Open(path, fileOpts(false)); !errors.As(err, &ce) || ce.Path != journal || !ce.Recoverable {
		t.Fatalf("Open of the damaged journal = %v, want a recoverable *CorruptError naming %s", err, journal)
	}

	f, err = statefile.Open(path, fileOpts(true))
	if err != nil {
		t.Fatal(err)
	}
	if f.Recovered() == nil {
		t.Fatal("the recovery reports nothing")
	}
	d, rep := openDoc(t, f)
	if rep.Lost == "" || !strings.Contains(rep.Lost, journal) {
		t.Errorf("LoadReport.Lost = %q, want the store's report naming the journal", rep.Lost)
	}
	if m := d.Get(b); m.State != Speculative {
		t.Fatalf("b is %v after its Create was dropped, want SPECULATIVE", m.State)
	}
	// The dropped Create's token, a later one of the same epoch, and an
	// older one are all refused: nothing accepted before the loss again.
	for _, tok := range []Token{{"s", 1, 2}, {"s", 1, 3}, {"s", 0, 9}} {
		if _, err := mut(t, d, Request{Kind: KindCreate, MachineID: b, Token: tok}); code(err) != CodeFenced {
			t.Errorf("token %v after the loss: %v, want fenced", tok, err)
		}
	}
	// A new epoch is accepted, and its op id is not the lost one.
	ack, err := mut(t, d, Request{Kind: KindCreate, MachineID: b, Token: Token{"s", 2, 1}})
	if err != nil || ack.OpID != "op-3" {
		t.Fatalf("create b again with a new epoch: %v %v, want op-3 (op-2 was acknowledged before the loss)", ack.OpID, err)
	}
	// Other shards never seen are not fenced.
	if _, err := mut(t, d, Request{Kind: KindCreate, MachineID: "z1/kvm.small/002", Token: Token{"t", 1, 1}}); err != nil {
		t.Errorf("a shard unknown before the loss: %v", err)
	}
	// Cursors from before the loss are void: a new lineage.
	if d.Lineage() == lineage {
		t.Errorf("the lineage is still %s after records were lost", lineage)
	}

	// The floors and the counter survive a restart; the loss report is
	// handled once.
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	f, err = statefile.Open(path, fileOpts(false))
	if err != nil {
		t.Fatal(err)
	}
	d, rep = openDoc(t, f)
	if rep.Lost != "" {
		t.Errorf("the loss is reported again after a restart: %q", rep.Lost)
	}
	if _, err := mut(t, d, Request{Kind: KindDelete, MachineID: a, Token: Token{"s", 1, 99}}); code(err) != CodeFenced {
		t.Errorf("an old epoch after a restart: %v, want fenced", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestEpochsAreBounded: the epochs kept for a recovery stay small whatever
// the shard ids (they are pinned beside the store's records), and shards
// past the tracked ones share a bucket that is never lower than any of
// them.
func TestEpochsAreBounded(t *testing.T) {
	var e epochs
	for i := range 1000 {
		shard := strings.Repeat(string(rune('a'+i%26)), MaxIDBytes-4) + strconv.Itoa(i)
		e.observe(shard, int64(i))
	}
	if len(e.Seen) != maxTrackedShards || e.Other == nil || *e.Other != 999 {
		t.Fatalf("seen %d shards, other %v", len(e.Seen), e.Other)
	}
	e.lost()
	if n := len(e.encode()); n > 2*maxTrackedShards*48+200 {
		t.Errorf("encoded epochs take %d bytes", n)
	}
	for _, tc := range []struct {
		shard string
		want  int64
	}{
		{strings.Repeat("a", MaxIDBytes-4) + "0", 0},     // tracked
		{strings.Repeat("z", MaxIDBytes-4) + "999", 999}, // the shared bucket
		{"never-seen", 999},                              // could have been in the bucket
	} {
		if got, ok := e.floor(tc.shard); !ok || got != tc.want {
			t.Errorf("floor(%.8s…) = %d %t, want %d", tc.shard, got, ok, tc.want)
		}
	}
	var fresh epochs
	fresh.observe("s", 5)
	fresh.lost()
	if _, ok := fresh.floor("other"); ok {
		t.Errorf("a shard never seen is floored although no shard overflowed")
	}
}
