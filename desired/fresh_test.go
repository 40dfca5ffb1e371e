package desired

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/internal/providertest"
)

// completeInFlight starts the completion of machine id's Create on a held
// store (which refuses it when refuse is not nil) and returns once that
// change is in flight: handed to the store, not yet called back. The
// channel gets Complete's error.
func completeInFlight(t *testing.T, d *Document, store *MemoryStore, id string, refuse error) <-chan error {
	t.Helper()
	a, err := mut(t, d, Request{Kind: KindCreate, MachineID: id})
	if err != nil {
		t.Fatal(err)
	}
	store.Hold()
	t.Cleanup(store.Release)
	if refuse != nil {
		store.Fail(refuse)
	}
	done := make(chan error, 1)
	go func() {
		_, err := d.Complete(context.Background(), id, a.OpID, Result{Host: "z1/h1"})
		done <- err
	}()
	for inflight(d, id) == 0 {
		time.Sleep(time.Millisecond)
	}
	if m := d.Get(id); m.State != Creating {
		t.Fatalf("Get shows %v while the completion is in flight, want the committed CREATING", m.State)
	}
	return done
}

// inflight counts the given machines whose change GetFresh would wait
// for: one the store has not called back yet.
func inflight(d *Document, ids ...string) int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	n := 0
	for _, id := range ids {
		if c := d.inflightFor(id); c != nil {
			select {
			case <-c.done:
			default:
				n++
			}
		}
	}
	return n
}

// TestGetFreshWaitsForTheChangeInFlight: while a machine's change is on
// its way to the store, GetFresh waits for it and answers what it
// committed; with nothing in flight it answers at once; and nothing is
// remembered once the store has called back.
func TestGetFreshWaitsForTheChangeInFlight(t *testing.T) {
	store := NewMemoryStore(nil)
	d := open(t, store, slots(2))
	id := "z1/kvm.small/000"
	completed := completeInFlight(t, d, store, id, nil)
	if m := d.GetFresh(providertest.OnWait(context.Background(), store.Release), id); m.State != Idle {
		t.Errorf("GetFresh answered %v, want IDLE, which the change in flight committed", m.State)
	}
	store.Release() // GetFresh did, unless it failed to wait
	if err := <-completed; err != nil {
		t.Fatal(err)
	}
	quiet := providertest.OnWait(context.Background(), func() { t.Error("GetFresh waited with nothing in flight") })
	if m := d.GetFresh(quiet, "z1/kvm.small/001"); m.State != Speculative {
		t.Errorf("untouched machine: %v", m.State)
	}
	if m := d.GetFresh(quiet, "no/such/machine"); m != nil {
		t.Errorf("unknown machine: %+v", m)
	}
	other := "z1/kvm.small/001"
	for _, kind := range []Kind{KindCreate, KindDelete, KindCreate} {
		a, err := mut(t, d, Request{Kind: kind, MachineID: other})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := d.Complete(context.Background(), other, a.OpID, Result{Host: "z1/h1"}); !ok || err != nil {
			t.Fatalf("complete %s: %t %v", kind, ok, err)
		}
	}
	if err := d.Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := inflight(d, id, other); n != 0 {
		t.Errorf("%d machines still recorded in flight after the store called every change back", n)
	}
}

// TestGetFreshNeverShowsWhatIsNotCommitted: a store that does not call
// back costs GetFresh at most FreshWait or its context, and a change the
// store refused is never shown; both answer the committed value.
func TestGetFreshNeverShowsWhatIsNotCommitted(t *testing.T) {
	store := NewMemoryStore(nil)
	d := open(t, store, slots(1))
	id := "z1/kvm.small/000"
	completed := completeInFlight(t, d, store, id, nil)
	if m := d.GetFresh(context.Background(), id); m.State != Creating {
		t.Errorf("stalled store: GetFresh answered %v, want the committed CREATING", m.State)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if m := d.GetFresh(ctx, id); m.State != Creating {
		t.Errorf("ended context: GetFresh answered %v, want the committed CREATING", m.State)
	}

	store.Release()
	if err := <-completed; err != nil {
		t.Fatal(err)
	}
	second := NewMemoryStore(nil)
	d = open(t, second, slots(1))
	failed := completeInFlight(t, d, second, id, errors.New("write state.journal: no space left on device"))
	if m := d.GetFresh(providertest.OnWait(context.Background(), second.Release), id); m.State != Creating {
		t.Errorf("refused change: GetFresh answered %v, want the committed CREATING", m.State)
	}
	second.Release()
	if err := <-failed; err == nil {
		t.Error("Complete on a failed store succeeded")
	}
	if n := inflight(d, id); n != 0 {
		t.Errorf("%d machines still recorded in flight after the store refused their change", n)
	}
}
