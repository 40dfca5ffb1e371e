package desired

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/naming"
)

// TestQuiesceWaitsUntilTheMachineIsHandedOn: Quiesce returns only once
// the changes accepted before it settled and their machines reached
// Notify (the reconciler's queue), so a graceful stop that shuts the
// queue after Quiesce cannot drop a mutation it accepted.
func TestQuiesceWaitsUntilTheMachineIsHandedOn(t *testing.T) {
	var armed atomic.Bool
	entered, proceed := make(chan string, 1), make(chan struct{})
	d, _, err := Open(context.Background(), Options{Store: NewMemoryStore(nil), DefaultInstallation: "inst", DeleteSupported: true,
		Now: func() time.Time { return t0 }, VMName: naming.VMName,
		Notify: func(id string) {
			if armed.Load() {
				entered <- id
				<-proceed
			}
		}}, slots(1))
	if err != nil {
		t.Fatal(err)
	}
	id := "z1/kvm.small/000"
	armed.Store(true)
	acked := make(chan error, 1)
	go func() {
		_, err := d.Mutate(context.Background(), Request{Kind: KindCreate, MachineID: id})
		acked <- err
	}()
	if got := <-entered; got != id {
		t.Fatalf("Notify(%q), want %q", got, id)
	}
	d.Refuse("stopping")
	quiesced := make(chan error, 1)
	go func() { quiesced <- d.Quiesce(context.Background()) }()
	select {
	case err := <-quiesced:
		t.Fatalf("Quiesce returned (%v) while the accepted Create's machine was still being handed on", err)
	case err := <-acked:
		t.Fatalf("the Create was acknowledged (%v) before its machine was handed on", err)
	case <-time.After(100 * time.Millisecond): // a negative check: the fixed code never ends it early
	}
	close(proceed)
	if err := <-quiesced; err != nil {
		t.Errorf("Quiesce: %v", err)
	}
	if err := <-acked; err != nil {
		t.Errorf("create: %v", err)
	}
	if m := d.Get(id); m == nil || m.State != Creating {
		t.Errorf("after Quiesce the machine is %v, want CREATING committed", m)
	}

	// With nothing in flight it returns at once; a bounded wait is honoured.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := d.Quiesce(ctx); err != nil {
		t.Errorf("Quiesce with nothing in flight: %v", err)
	}
}
