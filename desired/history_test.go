package desired

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/naming"
)

// countingStore counts the batches committed to a MemoryStore and keeps
// the keys of each.
type countingStore struct {
	*MemoryStore
	mu      sync.Mutex
	batches [][]string
}

func (s *countingStore) Commit(ops []Op, done func(error)) {
	keys := make([]string, len(ops))
	for i, op := range ops {
		keys[i] = op.Key
	}
	s.mu.Lock()
	s.batches = append(s.batches, keys)
	s.mu.Unlock()
	s.MemoryStore.Commit(ops, done)
}

func (s *countingStore) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.batches)
}

func (s *countingStore) last() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.batches[len(s.batches)-1]
}

func openHist(t testing.TB, store Store, s []Slot, now *time.Time, ho HistoryOptions) *Document {
	t.Helper()
	d, _, err := Open(context.Background(), Options{Store: store, DefaultInstallation: "inst", DeleteSupported: true,
		Now: func() time.Time { return *now }, VMName: naming.VMName, History: ho}, s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// brief is an event without its sequence number and time, for comparing.
func brief(evs []Event) []string {
	var out []string
	for _, e := range evs {
		s := strings.Join(strings.Fields(e.Kind+" "+e.From+">"+e.To+" "+e.OpID+" "+e.Cause+" "+e.Action+" "+e.Outcome), " ")
		if e.Exit != nil {
			s += fmt.Sprintf(" exit=%d", *e.Exit)
		}
		out = append(out, strings.TrimSpace(s))
	}
	return out
}

// A transition's event is written in the transition's own commit (so it is
// exactly as durable) and costs no commit of its own; step events ride
// along with the next commit and are invisible until then.
func TestHistoryRidesAlongWithCommits(t *testing.T) {
	now := t0
	store := &countingStore{MemoryStore: NewMemoryStore(nil)}
	d := openHist(t, store, slots(1000), &now, HistoryOptions{})
	id := "z1/kvm.small/000"
	// Many other histories wait for a commit: at most histRingsPerCommit
	// of them ride along with the Create, but never instead of its own.
	for i := 1; i < 1000; i++ {
		d.Record(fmt.Sprintf("z1/kvm.small/%03d", i), Event{Kind: EventDrift, Action: "start"})
	}
	before := store.count()
	a, err := mut(t, d, Request{Kind: KindCreate, MachineID: id})
	if err != nil {
		t.Fatal(err)
	}
	if got := store.count() - before; got != 1 {
		t.Fatalf("a Create made %d commits, want 1", got)
	}
	if !contains(store.last(), keyHistory+id) || !contains(store.last(), keyMachine+id) {
		t.Fatalf("the Create's batch %v does not carry the machine and its history together", store.last())
	}
	rings := 0
	for _, k := range store.last() {
		if strings.HasPrefix(k, keyHistory) {
			rings++
		}
	}
	if rings > histRingsPerCommit+1 {
		t.Errorf("%d histories rode along with one Create, bound %d", rings, histRingsPerCommit+1)
	}
	// Steps are recorded without a commit.
	before = store.count()
	d.Record(id, Event{Kind: EventStep, Action: "create-overlay", Outcome: "ok", DurationMS: 41000})
	d.Record(id, Event{Kind: EventStep, Action: "wait-agent", Outcome: "ok", DurationMS: 95000})
	if store.count() != before {
		t.Fatalf("Record committed")
	}
	h, _ := d.History(id)
	if diff := cmp.Diff([]string{"transition SPECULATIVE>CREATING " + a.OpID + " rpc"}, brief(h.Events)); diff != "" {
		t.Errorf("readers saw uncommitted events (-want +got):\n%s", diff)
	}
	if _, err := d.Complete(context.Background(), id, a.OpID, Result{Host: "z1/vm"}); err != nil {
		t.Fatal(err)
	}
	h, _ = d.History(id)
	want := []string{
		"transition SPECULATIVE>CREATING " + a.OpID + " rpc",
		"step > create-overlay ok",
		"step > wait-agent ok",
		"transition CREATING>IDLE " + a.OpID + " completed",
	}
	if diff := cmp.Diff(want, brief(h.Events)); diff != "" {
		t.Errorf("history (-want +got):\n%s", diff)
	}
	// What is read is what the store holds.
	stored, err := ReadHistory(snapshot(t, store))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, brief(stored[id].Events)); diff != "" {
		t.Errorf("stored history (-want +got):\n%s", diff)
	}
}

func contains(keys []string, k string) bool {
	for _, x := range keys {
		if x == k {
			return true
		}
	}
	return false
}

// Histories survive a restart; interrupted transitions are re-driven with
// the configured cause; events not yet committed are lost, transitions
// never are.
func TestHistorySurvivesReopen(t *testing.T) {
	now := t0
	mem := NewMemoryStore(nil)
	d := openHist(t, mem, slots(2), &now, HistoryOptions{})
	id := "z1/kvm.small/000"
	a, _ := mut(t, d, Request{Kind: KindCreate, MachineID: id})
	d.Record(id, Event{Kind: EventStep, Action: "clone", Outcome: "ok"}) // never committed: lost
	// The process dies here: a new document opens the store's contents.
	re := NewMemoryStore(snapshot(t, mem))
	now = now.Add(time.Minute)
	d2 := openHist(t, re, slots(2), &now, HistoryOptions{Redrive: CauseFailover})
	if err := d2.FlushHistory(context.Background()); err != nil {
		t.Fatal(err)
	}
	h, _ := d2.History(id)
	want := []string{
		"transition SPECULATIVE>CREATING " + a.OpID + " rpc",
		"transition CREATING>CREATING " + a.OpID + " fail-over re-drive",
	}
	if diff := cmp.Diff(want, brief(h.Events)); diff != "" {
		t.Errorf("history after reopen (-want +got):\n%s", diff)
	}
	if h.Events[1].Seq != h.Events[0].Seq+1 {
		t.Errorf("seq after reopen: %d then %d", h.Events[0].Seq, h.Events[1].Seq)
	}
}

// The ring and the total bound hold, and so does the bookkeeping behind
// the total bound.
func TestHistoryBounds(t *testing.T) {
	now := t0
	mem := NewMemoryStore(nil)
	d := openHist(t, mem, slots(10), &now, HistoryOptions{Events: 5, Total: 12})
	for i := 0; i < 1000; i++ {
		id := fmt.Sprintf("z1/kvm.small/%03d", i%10)
		now = now.Add(time.Second)
		d.Record(id, Event{Kind: EventStep, Action: "start", Outcome: "ok"})
	}
	if err := d.FlushHistory(context.Background()); err != nil {
		t.Fatal(err)
	}
	events, _ := d.HistoryStats()
	if events > 12 {
		t.Errorf("%d events held, bound 12", events)
	}
	d.mu.Lock()
	fifo := len(d.hist.fifo)
	d.mu.Unlock()
	if fifo > 2*12+1024 {
		t.Errorf("the total bound's queue holds %d entries", fifo)
	}
	stored, _ := ReadHistory(snapshot(t, mem))
	total := 0
	for id, h := range stored {
		if len(h.Events) > 5 {
			t.Errorf("%s: %d events stored, ring bound 5", id, len(h.Events))
		}
		total += len(h.Events)
	}
	if total > 12 {
		t.Errorf("%d events stored, bound 12", total)
	}
	// The newest events are the ones kept.
	h, _ := d.History("z1/kvm.small/009")
	if len(h.Events) == 0 || !h.Events[len(h.Events)-1].At.Equal(now) {
		t.Errorf("the newest event was not kept: %+v", h.Events)
	}
	// A reopen with a smaller ring trims what it loads.
	d2 := openHist(t, NewMemoryStore(snapshot(t, mem)), slots(10), &now, HistoryOptions{Events: 1, Total: 12})
	h, _ = d2.History("z1/kvm.small/009")
	if len(h.Events) > 1 {
		t.Errorf("reopened with ring 1: %d events", len(h.Events))
	}
}

// A machine that leaves the document keeps its history for the retention,
// then the history goes too.
func TestHistoryOfDeletedMachineExpires(t *testing.T) {
	now := t0
	mem := NewMemoryStore(nil)
	d := openHist(t, mem, slots(2), &now, HistoryOptions{Retention: time.Hour})
	id := "z1/kvm.small/001"
	a, _ := mut(t, d, Request{Kind: KindCreate, MachineID: id})
	d.Complete(context.Background(), id, a.OpID, Result{Host: "h"})
	a, _ = mut(t, d, Request{Kind: KindDelete, MachineID: id})
	d.Complete(context.Background(), id, a.OpID, Result{})
	// The offering shrinks: the SPECULATIVE machine leaves the document.
	d2 := openHist(t, mem, slots(1), &now, HistoryOptions{Retention: time.Hour})
	h, ok := d2.History(id)
	if !ok || h.Deleted.IsZero() || h.State != "" || h.Events[len(h.Events)-1].Kind != EventDeleted {
		t.Fatalf("a removed machine's history: %v %+v", ok, h)
	}
	if got := d2.Histories(time.Time{}, "", "DELETED"); len(got) != 1 || got[0].ID != id {
		t.Errorf("fleet timeline of DELETED: %+v", got)
	}
	now = now.Add(30 * time.Minute)
	d2.FlushHistory(context.Background())
	if _, ok := d2.History(id); !ok {
		t.Fatalf("history dropped inside the retention")
	}
	now = now.Add(time.Hour)
	if err := d2.FlushHistory(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, ok := d2.History(id); ok {
		t.Errorf("history kept past the retention")
	}
	if _, ok := snapshot(t, mem)[keyHistory+id]; ok {
		t.Errorf("stored history kept past the retention")
	}
}

// Failures say why: a deadline that passed is a timeout, an outcome
// without an operation a drift.
func TestHistoryFailCauses(t *testing.T) {
	now := t0
	d := openHist(t, NewMemoryStore(nil), slots(2), &now, HistoryOptions{})
	id := "z1/kvm.small/000"
	a, _ := mut(t, d, Request{Kind: KindCreate, MachineID: id})
	now = now.Add(time.Hour)
	d.Fail(context.Background(), id, a.OpID, "create timed out")
	h, _ := d.History(id)
	if last := h.Events[len(h.Events)-1]; last.Cause != CauseTimeout || last.Error != "create timed out" || last.To != "FAILED" {
		t.Errorf("timeout: %+v", last)
	}
	id = "z1/kvm.small/001"
	a, _ = mut(t, d, Request{Kind: KindCreate, MachineID: id})
	d.Complete(context.Background(), id, a.OpID, Result{Host: "h"})
	d.Fail(context.Background(), id, "", "VM vanished")
	h, _ = d.History(id)
	if last := h.Events[len(h.Events)-1]; last.Cause != CauseDrift {
		t.Errorf("drift: %+v", last)
	}
}

// A stored document written before histories existed loads, and one with
// a history record of an unknown version is refused, not misread.
func TestHistoryFormatCompatibility(t *testing.T) {
	now := t0
	mem := NewMemoryStore(nil)
	d := openHist(t, mem, slots(1), &now, HistoryOptions{})
	mut(t, d, Request{Kind: KindCreate, MachineID: "z1/kvm.small/000"})
	old := snapshot(t, mem)
	for k := range old {
		if strings.HasPrefix(k, keyHistory) {
			delete(old, k)
		}
	}
	d2 := openHist(t, NewMemoryStore(old), slots(1), &now, HistoryOptions{})
	if m := d2.Get("z1/kvm.small/000"); m == nil || m.State != Creating {
		t.Fatalf("a document without histories did not load: %+v", m)
	}
	old[keyHistory+"z1/kvm.small/000"] = []byte(`{"v":2,"events":[]}`)
	_, _, err := Open(context.Background(), Options{Store: NewMemoryStore(old), DefaultInstallation: "inst",
		Now: func() time.Time { return now }, VMName: naming.VMName}, slots(1))
	if err == nil || !strings.Contains(err.Error(), "version 2") {
		t.Errorf("unknown history version: %v", err)
	}
}
