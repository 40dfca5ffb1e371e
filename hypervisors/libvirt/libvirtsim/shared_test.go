package libvirtsim

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
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

// shape is the libvirt host set as the shared suite drives it.
var shape = simtest.Shape{
	Open: func(o simcore.Options) (simtest.Sim, error) { return OpenLibvirt(Options{Options: o}) },
	Create: func(t *testing.T, h simtest.Sim, name string, m observed.Marker) hypervisors.Target {
		f := h.(*Libvirt)
		zone := f.Zones()[0]
		mustLibvirtCreate(t, f, zone, name, m)
		return hypervisors.Target{Zone: zone, Name: name}
	},
	Place: func(t *testing.T, h simtest.Sim, name string, m observed.Marker) hypervisors.Target {
		f := h.(*Libvirt)
		zone := f.Zones()[0]
		if err := f.AddOwnedVM(zone, name, m, observed.PowerRunning); err != nil {
			t.Fatal(err)
		}
		return hypervisors.Target{Zone: zone, Name: name}
	},
	BlobPath:  simcore.DefaultBlobPath,
	Bootstrap: func(cluster string) []string { return []string{simcore.DefaultBootstrapHook, cluster} },
}

// TestShared runs the behaviour every simulator shares on this one.
func TestShared(t *testing.T) { simtest.Run(t, shape) }

// The simulator offers the libvirt steps, so the executor applies them.
func TestSteps(t *testing.T) {
	f := NewLibvirt(Options{})
	defer f.Close()
	if _, ok := hypervisors.Find[lvspec.Steps](f); !ok {
		t.Error("the libvirt simulator does not offer lvspec.Steps")
	}
}

func mustLibvirtCreate(t *testing.T, f *Libvirt, zone, name string, m observed.Marker) {
	t.Helper()
	ctx := context.Background()
	if err := f.CreateOverlay(ctx, zone, lvspec.OverlaySpec{Pool: DefaultPool, Name: lvspec.OverlayVolume(name), BaseImage: DefaultImage}); err != nil {
		t.Fatal(err)
	}
	if err := f.CreateSeed(ctx, zone, lvspec.SeedSpec{Pool: DefaultPool, Name: lvspec.SeedVolume(name), InstanceID: name, Hostname: name}); err != nil {
		t.Fatal(err)
	}
	if err := f.DefineDomain(ctx, zone, domainSpec(name, m)); err != nil {
		t.Fatal(err)
	}
}

func domainSpec(name string, m observed.Marker) lvspec.DomainSpec {
	return lvspec.DomainSpec{
		Name: name, VCPU: 2, MemoryMiB: 4096, DomainType: "kvm", Pool: DefaultPool,
		Overlay: lvspec.OverlayVolume(name), Seed: lvspec.SeedVolume(name), Network: DefaultNetwork, Marker: m,
	}
}

func TestHooksAndReachability(t *testing.T) {
	transient := errors.New("boom")
	ctx := context.Background()
	var seen []simcore.Call
	var mu sync.Mutex
	record := func(_ context.Context, c simcore.Call) error {
		mu.Lock()
		seen = append(seen, c)
		mu.Unlock()
		return nil
	}
	f := NewLibvirt(Options{Options: simcore.Options{Zones: []string{"rack1", "rack2"}, Hook: simcore.Chain(record, simcore.FailN("Observe", 2, transient))}})
	defer f.Close()
	for i, want := range []error{transient, transient, nil, nil} {
		_, err := f.Observe(ctx, "rack1")
		errIs(t, "observe", err, want)
		_ = i
	}
	f.SetUnreachable("rack2", true)
	_, err := f.Observe(ctx, "rack2")
	errIs(t, "observe unreachable", err, hypervisors.ErrUnreachable)
	errIs(t, "start unreachable", f.Start(ctx, hypervisors.Target{Zone: "rack2", Name: "x"}), hypervisors.ErrUnreachable)
	if d := cmp.Diff(map[string]error{"rack1": nil, "rack2": hypervisors.ErrUnreachable}, f.ZoneHealth(), cmpopts.EquateErrors()); d != "" {
		t.Errorf("health (-want +got)\n%s", d)
	}
	f.SetUnreachable("rack2", false)
	_, err = f.Observe(ctx, "rack2")
	errIs(t, "observe reachable again", err, nil)

	f.SetHook(func(_ context.Context, c simcore.Call) error {
		if c.Op == "DefineDomain" && c.Target.Name == "bf-x" {
			return hypervisors.ErrPermission
		}
		return nil
	})
	errIs(t, "hooked define", f.DefineDomain(ctx, "rack1", domainSpec("bf-x", marker("m", ""))), hypervisors.ErrPermission)
	if d := cmp.Diff(map[string]int{"Observe": 6, "Start": 1, "DefineDomain": 1}, f.Calls()); d != "" {
		t.Errorf("calls (-want +got)\n%s", d)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []simcore.Call{
		{Op: "Observe", Zone: "rack1", Target: hypervisors.Target{Zone: "rack1"}},
		{Op: "Observe", Zone: "rack1", Target: hypervisors.Target{Zone: "rack1"}},
		{Op: "Observe", Zone: "rack1", Target: hypervisors.Target{Zone: "rack1"}},
		{Op: "Observe", Zone: "rack1", Target: hypervisors.Target{Zone: "rack1"}},
		{Op: "Observe", Zone: "rack2", Target: hypervisors.Target{Zone: "rack2"}},
		{Op: "Start", Zone: "rack2", Target: hypervisors.Target{Zone: "rack2", Name: "x"}},
		{Op: "Observe", Zone: "rack2", Target: hypervisors.Target{Zone: "rack2"}},
	}
	if d := cmp.Diff(want, seen); d != "" {
		t.Errorf("hook saw (-want +got)\n%s", d)
	}
	f.ResetCalls()
	if len(f.Calls()) != 0 {
		t.Errorf("calls after reset: %v", f.Calls())
	}
}
