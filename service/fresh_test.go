package service

import (
	"bytes"
	"context"
	"testing"
	"time"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/internal/providertest"
	"github.com/bigfleet-vm/provider/naming"
)

// TestGetAnswersTheChangeInFlight: a Get that arrives while the machine's
// change is on its way to the store answers what that change commits,
// once it has, rather than the value it supersedes (a poll saved).
func TestGetAnswersTheChangeInFlight(t *testing.T) {
	store := desired.NewMemoryStore(nil)
	slot := desired.Slot{ID: "rack0/kvm.small/000", Zone: "rack0", InstanceType: "kvm.small", Capacity: desired.OnDemand,
		VCPU: 2, MemoryMiB: 4096, Price: 0.0092, Resources: map[string]string{"cpu": "1", "memory": "2Gi"}}
	d, _, err := desired.Open(context.Background(), desired.Options{Store: store, DefaultInstallation: "i",
		DeleteSupported: true, Now: time.Now, VMName: naming.VMName}, []desired.Slot{slot})
	if err != nil {
		t.Fatal(err)
	}
	s := New(Fixed{d}, "libvirt")
	ack, err := s.Create(context.Background(), &pb.CreateRequest{MachineId: slot.ID})
	if err != nil {
		t.Fatal(err)
	}
	stored := func() []byte { // the machine's record, under m/<id>
		all, _ := store.Load(context.Background())
		v, ok := all["m/"+slot.ID]
		if !ok {
			t.Fatalf("no stored record m/%s", slot.ID)
		}
		return v
	}
	before := stored()
	store.Hold()
	defer store.Release()
	completed := make(chan error, 1)
	go func() {
		_, err := d.Complete(context.Background(), slot.ID, ack.GetOperationId(), desired.Result{Host: "rack0/h1"})
		completed <- err
	}()
	for bytes.Equal(stored(), before) { // applied by the store, not yet called back
		time.Sleep(time.Millisecond)
	}
	ref := &pb.MachineRef{Id: slot.ID}
	m, err := s.Get(providertest.OnWait(context.Background(), store.Release), ref)
	if err != nil {
		t.Fatal(err)
	}
	if m.State != pb.MachineState_MACHINE_STATE_IDLE {
		t.Errorf("Get answered %v, want IDLE, which the change in flight committed", m.State)
	}
	store.Release()
	if err := <-completed; err != nil {
		t.Fatal(err)
	}
}
