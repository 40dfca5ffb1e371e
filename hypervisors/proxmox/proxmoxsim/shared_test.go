package proxmoxsim

import (
	"context"
	"testing"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvespec"
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
	"github.com/bigfleet-vm/provider/hypervisors/simcore/simtest"
	"github.com/bigfleet-vm/provider/observed"
)

const inst = simtest.Inst

var (
	marker   = simtest.Marker
	errIs    = simtest.ErrIs
	ignoreAt = simtest.IgnoreAt
)

// shape is the Proxmox cluster as the shared suite drives it.
var shape = simtest.Shape{
	Open: func(o simcore.Options) (simtest.Sim, error) { return OpenProxmox(Options{Options: o}) },
	Create: func(t *testing.T, h simtest.Sim, name string, m observed.Marker) hypervisors.Target {
		t.Helper()
		ctx := context.Background()
		f := h.(*Proxmox)
		zone := f.Zones()[0]
		id, err := f.CloneVM(ctx, zone, pvespec.CloneSpec{Name: name, TemplateVMID: DefaultTemplateVMID, Marker: m})
		if err != nil {
			t.Fatal(err)
		}
		tg := hypervisors.Target{Zone: zone, Name: name, VMID: id}
		if err := f.ConfigureVM(ctx, tg, pvespec.SizeSpec{VCPU: 2, MemoryMiB: 4096, Marker: m}); err != nil {
			t.Fatal(err)
		}
		return tg
	},
	Place: func(t *testing.T, h simtest.Sim, name string, m observed.Marker) hypervisors.Target {
		t.Helper()
		f := h.(*Proxmox)
		zone := f.Zones()[0]
		id, err := f.AddOwnedVM(zone, name, m, observed.PowerRunning)
		if err != nil {
			t.Fatal(err)
		}
		return hypervisors.Target{Zone: zone, Name: name, VMID: id}
	},
	BlobPath: simcore.DefaultBootstrapPath,
	// --bootstrap-exec: the cluster is the marker's.
	Bootstrap: func(string) []string { return []string{"/bin/sh", simcore.DefaultBootstrapPath} },
}

// TestShared runs the behaviour every simulator shares on this one.
func TestShared(t *testing.T) { simtest.Run(t, shape) }

// The simulator offers the Proxmox steps, so the executor applies them.
func TestSteps(t *testing.T) {
	f := NewProxmox(Options{})
	defer f.Close()
	if _, ok := hypervisors.Find[pvespec.Steps](f); !ok {
		t.Error("the Proxmox simulator does not offer pvespec.Steps")
	}
}
