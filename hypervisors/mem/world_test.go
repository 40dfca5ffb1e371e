package mem

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
	"github.com/bigfleet-vm/provider/observed"
)

// journal is a simcore.Store kept in a map, as a state store's snapshot.
type journal map[string][]byte

func (j journal) Journal(key string, value []byte) {
	if value == nil {
		delete(j, key)
		return
	}
	j[key] = value
}

// TestWorldFindsVMsByID: a create allocates an id and is an ensure (a
// repeat adopts the VM carrying the same marker, another zone refuses
// it); VMs are found by id, so a foreign VM of the same name is another
// VM; the marker is read back from the record, SetMarker refuses another
// owner; the journaled world reopens as it was.
func TestWorldFindsVMsByID(t *testing.T) {
	ctx := context.Background()
	j := journal{}
	w := newWorld(simcore.Options{Zones: []string{"a", "b"}, Store: j})
	mk := observed.Marker{Installation: "inst", MachineID: "m1", InstanceType: "mem.small"}
	mine := &create{Name: "vm1", VCPU: 2, MemoryMiB: 2048, Marker: mk}

	id, err := w.Apply(ctx, hypervisors.Target{Zone: "a", Name: "vm1"}, mine)
	if err != nil || id == 0 {
		t.Fatalf("create: id %d, %v; want a new id", id, err)
	}
	if again, err := w.Apply(ctx, hypervisors.Target{Zone: "a", Name: "vm1"}, mine); again != id || err != nil {
		t.Errorf("create repeated: id %d, %v; want %d adopted", again, err, id)
	}
	if _, err := w.Apply(ctx, hypervisors.Target{Zone: "b", Name: "vm1"}, mine); !errors.Is(err, hypervisors.ErrExists) {
		t.Errorf("create of the same machine on another zone: %v; want ErrExists", err)
	}
	if err := w.AddForeign(hypervisors.Target{Zone: "a", Name: "vm1"}); err != nil {
		t.Fatalf("add a foreign VM of the same name: %v", err)
	}
	ours := hypervisors.Target{Zone: "a", Name: "vm1", VMID: id}
	if err := w.Start(ctx, ours); err != nil {
		t.Fatal(err)
	}
	other := mk
	other.MachineID = "m2"
	if err := w.SetMarker(ctx, ours, other); !errors.Is(err, hypervisors.ErrNotOwned) {
		t.Errorf("SetMarker of another machine: %v; want ErrNotOwned", err)
	}
	bound := mk
	bound.Cluster = "c1"
	if err := w.SetMarker(ctx, ours, bound); err != nil {
		t.Fatal(err)
	}

	z, err := w.Observe(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	want := []*observed.VM{
		{Zone: "a", Name: "vm1", VMID: id, Power: observed.PowerRunning, VCPU: 2, MemoryMiB: 2048, Marker: &bound},
		{Zone: "a", Name: "vm1", VMID: id + 1, Power: observed.PowerRunning, VCPU: 2, MemoryMiB: 2048},
	}
	if diff := cmp.Diff(want, z.VMs); diff != "" {
		t.Errorf("Observe (-want +got):\n%s", diff)
	}

	reopened, err := openWorld(simcore.Options{Zones: []string{"a", "b"}, State: j})
	if err != nil {
		t.Fatal(err)
	}
	rz, err := reopened.Observe(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(z.VMs, rz.VMs); diff != "" {
		t.Errorf("the reopened world (-before +after):\n%s", diff)
	}

	if _, err := w.Apply(ctx, ours, &destroy{}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Lookup(ctx, ours); !errors.Is(err, hypervisors.ErrNotFound) {
		t.Errorf("Lookup after destroy: %v; want ErrNotFound", err)
	}
	if _, ok := j[simcore.StatePrefix+keyVM+"1"]; ok {
		t.Error("the destroyed VM is still journaled")
	}
}

// TestAgentGoesOverMemsTransport: the guest calls run the at-most-once
// protocol over mem's own channel: a blob longer than one message goes
// in parts (one wire write each) and arrives whole, and the bootstrap
// hook that reads it then runs once.
func TestAgentGoesOverMemsTransport(t *testing.T) {
	ctx := context.Background()
	w := newWorld(simcore.Options{Zones: []string{"a"}})
	mk := observed.Marker{Installation: "inst", MachineID: "m1", InstanceType: "mem.small"}
	id, err := w.Apply(ctx, hypervisors.Target{Zone: "a", Name: "vm1"}, &create{Name: "vm1", VCPU: 2, MemoryMiB: 2048, Marker: mk})
	if err != nil {
		t.Fatal(err)
	}
	vm := hypervisors.Target{Zone: "a", Name: "vm1", VMID: id}
	if err := w.Start(ctx, vm); err != nil {
		t.Fatal(err)
	}
	blob := bytes.Repeat([]byte("k"), 10*maxWrite+1)
	var writes atomic.Int64
	w.c.SetHook(func(_ context.Context, c simcore.Call) error {
		if c.Op == simcore.AgentWriteOp {
			writes.Add(1)
		}
		return nil
	})
	if err := w.AgentWriteFile(ctx, vm, "/opt/bigfleet/bootstrap.blob", blob, 0o600); err != nil {
		t.Fatal(err)
	}
	if n := writes.Load(); n < 11 {
		t.Errorf("%d wire writes for %d bytes; mem's channel carries %d per message", n, len(blob), maxWrite)
	}
	if got, ok := w.c.GuestFile(vm, "/opt/bigfleet/bootstrap.blob"); !ok || !bytes.Equal(got, blob) {
		t.Errorf("the guest holds %d bytes (%v), want the %d written", len(got), ok, len(blob))
	}
	res, err := w.AgentExec(ctx, vm, []string{"/opt/bigfleet/bootstrap", "c1"})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("bootstrap hook: %+v, %v", res, err)
	}
	if b := w.c.Bootstraps(vm); len(b) != 1 || b[0].Cluster != "c1" {
		t.Errorf("bootstraps %+v, want one for c1", b)
	}
}
