package libvirtsim

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
	"github.com/bigfleet-vm/provider/naming"
	"github.com/bigfleet-vm/provider/observed"
)

// TestLibvirtLifecycle walks create, configure, drain and delete as the
// executor drives them, running every call twice: an ensure repeated gives
// the same result and never duplicates anything.
func TestLibvirtLifecycle(t *testing.T) {
	ctx := context.Background()
	f := NewLibvirt(Options{Options: simcore.Options{Zones: []string{"rack1"}}})
	defer f.Close()
	name := naming.VMName(inst, "m-1", 0)
	vm := hypervisors.Target{Zone: "rack1", Name: name}
	m := marker("m-1", "")
	bound := marker("m-1", "c-1")
	blob := []byte("join-secret")
	exec := func(argv ...string) func() error {
		return func() error {
			r, err := f.AgentExec(ctx, vm, argv)
			if err == nil && r.ExitCode != 0 {
				t.Errorf("%v: exit %d: %s", argv, r.ExitCode, r.Stderr)
			}
			return err
		}
	}
	overlay := &observed.Volume{Zone: "rack1", Pool: "default", Name: lvspec.OverlayVolume(name), Format: "qcow2", BackingFormat: "qcow2"}
	// The seed observes with the identity of the content it was built from.
	seedVol := &observed.Volume{Zone: "rack1", Pool: "default", Name: lvspec.SeedVolume(name), Format: "iso",
		Identity: lvspec.SeedIdentity(lvspec.SeedSpec{InstanceID: name, Hostname: name})}
	domainVM := func(power observed.Power, mk observed.Marker, autostart bool) *observed.VM {
		return &observed.VM{Zone: "rack1", Name: name, Marker: &mk, Power: power, VCPU: 2, MemoryMiB: 4096,
			Autostart: autostart, Volumes: []string{overlay.Name, seedVol.Name}}
	}
	steps := []struct {
		name string
		run  func() error
		want *observed.Zone // observation after the step, if set
	}{
		{"create-overlay", func() error {
			return f.CreateOverlay(ctx, "rack1", lvspec.OverlaySpec{Pool: "default", Name: overlay.Name, BaseImage: DefaultImage})
		}, &observed.Zone{Name: "rack1", Status: observed.StatusOK, Volumes: []*observed.Volume{overlay}}},
		{"create-seed", func() error {
			return f.CreateSeed(ctx, "rack1", lvspec.SeedSpec{Pool: "default", Name: seedVol.Name, InstanceID: name, Hostname: name})
		}, &observed.Zone{Name: "rack1", Status: observed.StatusOK, Volumes: []*observed.Volume{seedVol, overlay}}},
		{"define", func() error { return f.DefineDomain(ctx, "rack1", domainSpec(name, m)) },
			&observed.Zone{Name: "rack1", Status: observed.StatusOK,
				VMs: []*observed.VM{domainVM(observed.PowerStopped, m, false)}, Volumes: []*observed.Volume{seedVol, overlay}}},
		{"start", func() error { return f.Start(ctx, vm) }, nil},
		{"autostart", func() error { return f.SetAutostart(ctx, vm, true) },
			&observed.Zone{Name: "rack1", Status: observed.StatusOK,
				VMs: []*observed.VM{domainVM(observed.PowerRunning, m, true)}, Volumes: []*observed.Volume{seedVol, overlay}}},
		{"wait-agent", func() error { return f.AgentPing(ctx, vm) }, nil},
		{"set-marker", func() error { return f.SetMarker(ctx, vm, bound) }, nil},
		{"write-blob", func() error { return f.AgentWriteFile(ctx, vm, simcore.DefaultBlobPath, blob, 0o600) }, nil},
		{"exec-bootstrap", exec(simcore.DefaultBootstrapHook, "c-1"), nil},
		{"remove-blob", func() error { return f.AgentRemoveFile(ctx, vm, simcore.DefaultBlobPath) }, nil},
		{"readiness", exec(simcore.DefaultReadyCommand), &observed.Zone{Name: "rack1", Status: observed.StatusOK,
			VMs: []*observed.VM{domainVM(observed.PowerRunning, bound, true)}, Volumes: []*observed.Volume{seedVol, overlay}}},
		{"exec-drain", exec("kubectl", "drain", name, "--ignore-daemonsets"), nil},
		{"unbind", func() error { return f.SetMarker(ctx, vm, m) }, nil},
		{"stop", func() error { return f.Stop(ctx, vm, time.Second) }, nil},
		{"undefine", func() error { return f.UndefineDomain(ctx, vm) },
			&observed.Zone{Name: "rack1", Status: observed.StatusOK, Volumes: []*observed.Volume{seedVol, overlay}}},
		{"delete-overlay", func() error { return f.DeleteVolume(ctx, "rack1", "default", overlay.Name) }, nil},
		{"delete-seed", func() error { return f.DeleteVolume(ctx, "rack1", "default", seedVol.Name) },
			&observed.Zone{Name: "rack1", Status: observed.StatusOK}},
	}
	for _, s := range steps {
		for try := range 2 {
			if err := s.run(); err != nil {
				t.Fatalf("%s (try %d): %v", s.name, try, err)
			}
			if s.want == nil {
				continue
			}
			got, err := f.Observe(ctx, "rack1")
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(s.want, got, ignoreAt); d != "" {
				t.Fatalf("%s (try %d): observed (-want +got)\n%s", s.name, try, d)
			}
		}
	}
	if got := f.Bootstraps(vm); len(got) != 0 {
		t.Errorf("bootstraps of an undefined domain: %v", got)
	}
	if d := cmp.Diff([]Volume{{Pool: "default", Name: DefaultImage, Format: "qcow2", CapacityGiB: 10}}, f.Volumes("rack1")); d != "" {
		t.Errorf("volumes left (-want +got)\n%s", d)
	}
}

func TestLibvirtSemantics(t *testing.T) {
	ctx := context.Background()
	name := naming.VMName(inst, "m-1", 0)
	vm := hypervisors.Target{Zone: "fake-a", Name: name}
	m := marker("m-1", "")
	build := func(t *testing.T, f *Libvirt) { mustLibvirtCreate(t, f, "fake-a", name, m) }
	running := func(t *testing.T, f *Libvirt) {
		build(t, f)
		if err := f.Start(ctx, vm); err != nil {
			t.Fatal(err)
		}
	}
	other := observed.Marker{Installation: "other", MachineID: "m-1"}
	cases := []struct {
		name  string
		setup func(*testing.T, *Libvirt)
		call  func(*Libvirt) error
		want  error
	}{
		{"overlay without base image", nil, func(f *Libvirt) error {
			return f.CreateOverlay(ctx, "fake-a", lvspec.OverlaySpec{Pool: "default", Name: "bf-o", BaseImage: "nope.qcow2"})
		}, hypervisors.ErrNotFound},
		{"overlay in missing pool", nil, func(f *Libvirt) error {
			return f.CreateOverlay(ctx, "fake-a", lvspec.OverlaySpec{Pool: "other", Name: "bf-o", BaseImage: DefaultImage})
		}, hypervisors.ErrNotFound},
		{"overlay over a foreign volume", nil, func(f *Libvirt) error {
			return f.CreateOverlay(ctx, "fake-a", lvspec.OverlaySpec{Pool: "default", Name: DefaultImage, BaseImage: DefaultImage})
		}, hypervisors.ErrExists},
		{"overlay over our seed", build, func(f *Libvirt) error {
			return f.CreateOverlay(ctx, "fake-a", lvspec.OverlaySpec{Pool: "default", Name: lvspec.SeedVolume(name), BaseImage: DefaultImage})
		}, hypervisors.ErrExists},
		{"define without volumes", nil, func(f *Libvirt) error { return f.DefineDomain(ctx, "fake-a", domainSpec(name, m)) }, hypervisors.ErrNotFound},
		{"define over unmarked domain", func(t *testing.T, f *Libvirt) {
			build(t, f)
			f.oob(vm, func(_ *lvHost, d *domain) { d.Marker = nil })
		}, func(f *Libvirt) error { return f.DefineDomain(ctx, "fake-a", domainSpec(name, m)) }, hypervisors.ErrExists},
		{"define over other installation", func(t *testing.T, f *Libvirt) {
			build(t, f)
			f.oob(vm, func(_ *lvHost, d *domain) { d.Marker = &other })
		}, func(f *Libvirt) error { return f.DefineDomain(ctx, "fake-a", domainSpec(name, m)) }, hypervisors.ErrExists},
		{"define over foreign domain", func(t *testing.T, f *Libvirt) {
			if err := f.AddForeignVM("fake-a", name, nil); err != nil {
				t.Fatal(err)
			}
			f.CreateOverlay(ctx, "fake-a", lvspec.OverlaySpec{Pool: "default", Name: lvspec.OverlayVolume(name), BaseImage: DefaultImage})
			f.CreateSeed(ctx, "fake-a", lvspec.SeedSpec{Pool: "default", Name: lvspec.SeedVolume(name)})
		}, func(f *Libvirt) error { return f.DefineDomain(ctx, "fake-a", domainSpec(name, m)) }, hypervisors.ErrExists},
		{"redefine ours adopts", running, func(f *Libvirt) error {
			s := domainSpec(name, m)
			s.VCPU = 4
			return f.DefineDomain(ctx, "fake-a", s)
		}, nil},
		{"define with create fault", build, func(f *Libvirt) error {
			s := domainSpec(name+"-2", m)
			s.Labels = map[string]string{simcore.CreateFaultLabel: "error"}
			return f.DefineDomain(ctx, "fake-a", s)
		}, hypervisors.ErrInvalid},
		{"define without marker", nil, func(f *Libvirt) error {
			return f.DefineDomain(ctx, "fake-a", domainSpec(name, observed.Marker{}))
		}, hypervisors.ErrInvalid},
		{"undefine running", running, func(f *Libvirt) error { return f.UndefineDomain(ctx, vm) }, hypervisors.ErrInvalid},
		{"undefine paused", func(t *testing.T, f *Libvirt) { running(t, f); f.PauseVM(vm) },
			func(f *Libvirt) error { return f.UndefineDomain(ctx, vm) }, hypervisors.ErrInvalid},
		{"undefine missing", nil, func(f *Libvirt) error { return f.UndefineDomain(ctx, vm) }, nil},
		{"stop missing", nil, func(f *Libvirt) error { return f.Stop(ctx, vm, 0) }, nil},
		{"stop paused waits grace", func(t *testing.T, f *Libvirt) { running(t, f); f.PauseVM(vm) },
			func(f *Libvirt) error { return f.Stop(ctx, vm, time.Millisecond) }, nil},
		{"stop paused honours ctx", func(t *testing.T, f *Libvirt) { running(t, f); f.PauseVM(vm) },
			func(f *Libvirt) error {
				ctx, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
				defer cancel()
				return f.Stop(ctx, vm, time.Hour)
			}, context.DeadlineExceeded},
		{"delete missing volume", nil, func(f *Libvirt) error { return f.DeleteVolume(ctx, "fake-a", "default", "bf-gone") }, nil},
		{"delete base image", nil, func(f *Libvirt) error { return f.DeleteVolume(ctx, "fake-a", "default", DefaultImage) }, hypervisors.ErrNotOwned},
		{"delete volume of running domain", running, func(f *Libvirt) error {
			return f.DeleteVolume(ctx, "fake-a", "default", lvspec.OverlayVolume(name))
		}, hypervisors.ErrInvalid},
		{"start missing", nil, func(f *Libvirt) error { return f.Start(ctx, vm) }, hypervisors.ErrNotFound},
		{"start with overlay gone", func(t *testing.T, f *Libvirt) {
			build(t, f)
			f.RemoveVolume("fake-a", "default", lvspec.OverlayVolume(name))
		}, func(f *Libvirt) error { return f.Start(ctx, vm) }, hypervisors.ErrNotFound},
		{"start with base image gone", func(t *testing.T, f *Libvirt) {
			build(t, f)
			f.RemoveVolume("fake-a", "default", DefaultImage)
		}, func(f *Libvirt) error { return f.Start(ctx, vm) }, hypervisors.ErrNotFound},
		{"start crashed", func(t *testing.T, f *Libvirt) { running(t, f); f.CrashVM(vm) },
			func(f *Libvirt) error { return f.Start(ctx, vm) }, nil},
		{"start paused resumes", func(t *testing.T, f *Libvirt) { running(t, f); f.PauseVM(vm) },
			func(f *Libvirt) error { return f.Start(ctx, vm) }, nil},
		{"resume stopped", build, func(f *Libvirt) error { return f.Resume(ctx, vm) }, hypervisors.ErrInvalid},
		{"set marker of another machine", build, func(f *Libvirt) error { return f.SetMarker(ctx, vm, marker("m-2", "")) }, hypervisors.ErrNotOwned},
		{"set autostart missing", nil, func(f *Libvirt) error { return f.SetAutostart(ctx, vm, true) }, hypervisors.ErrNotFound},
		{"unknown zone", nil, func(f *Libvirt) error { return f.Start(ctx, hypervisors.Target{Zone: "mars", Name: name}) }, hypervisors.ErrInvalid},
		{"ping paused", func(t *testing.T, f *Libvirt) { running(t, f); f.PauseVM(vm) },
			func(f *Libvirt) error { return f.AgentPing(ctx, vm) }, hypervisors.ErrAgentNotReady},
		{"ping missing", nil, func(f *Libvirt) error { return f.AgentPing(ctx, vm) }, hypervisors.ErrNotFound},
		{"empty argv", running, func(f *Libvirt) error { _, err := f.AgentExec(ctx, vm, nil); return err }, hypervisors.ErrInvalid},
	}
	// withFaults are the cases run with Options.Faults.
	withFaults := map[string]bool{"define with create fault": true}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := NewLibvirt(Options{Options: simcore.Options{Faults: withFaults[c.name]}})
			defer f.Close()
			if c.setup != nil {
				c.setup(t, f)
			}
			err := c.call(f)
			errIs(t, c.name, err, c.want)
			if err2 := c.call(f); c.want != nil && err2 == nil {
				t.Errorf("repeat: %v, want %v again", err2, c.want)
			}
		})
	}
}

// TestLibvirtForeignCollision: a domain named like ours but unmarked is
// observed without a marker and never adopted.
func TestLibvirtForeignCollision(t *testing.T) {
	ctx := context.Background()
	f := NewLibvirt(Options{Options: simcore.Options{Zones: []string{"rack1"}}})
	defer f.Close()
	name := naming.VMName(inst, "m-1", 0)
	if err := f.AddForeignVM("rack1", name, nil); err != nil {
		t.Fatal(err)
	}
	other := observed.Marker{Installation: "other", MachineID: "x"}
	if err := f.AddForeignVM("rack1", "bf-other", &other); err != nil {
		t.Fatal(err)
	}
	if err := f.AddOwnedVM("rack1", "bf-mine", marker("m-2", ""), observed.PowerStopped); err != nil {
		t.Fatal(err)
	}
	z, err := f.Observe(ctx, "rack1")
	if err != nil {
		t.Fatal(err)
	}
	want := &observed.Zone{Name: "rack1", Status: observed.StatusOK,
		VMs: []*observed.VM{
			{Zone: "rack1", Name: name, Power: observed.PowerRunning, VCPU: 2, MemoryMiB: 2048, Volumes: []string{"foreign-" + name + ".qcow2"}},
			{Zone: "rack1", Name: "bf-mine", Marker: &observed.Marker{Installation: inst, MachineID: "m-2", OpID: "op-m-2", InstanceType: "kvm.small"},
				Power: observed.PowerStopped, VCPU: 2, MemoryMiB: 2048, Volumes: []string{"bf-mine-disk.qcow2", "bf-mine-cidata.iso"}},
			{Zone: "rack1", Name: "bf-other", Marker: &other, Power: observed.PowerRunning, VCPU: 2, MemoryMiB: 2048, Volumes: []string{"foreign-bf-other.qcow2"}},
		},
		Volumes: []*observed.Volume{
			{Zone: "rack1", Pool: "default", Name: "bf-mine-cidata.iso", Format: "iso",
				Identity: lvspec.SeedIdentity(lvspec.SeedSpec{InstanceID: "bf-mine", Hostname: "bf-mine"})},
			{Zone: "rack1", Pool: "default", Name: "bf-mine-disk.qcow2", Format: "qcow2", BackingFormat: "qcow2"},
		}}
	if d := cmp.Diff(want, z, ignoreAt); d != "" {
		t.Errorf("observed (-want +got)\n%s", d)
	}
	if z.VolumesAt.IsZero() || !z.VolumesAt.Equal(z.At) {
		t.Errorf("VolumesAt %v, want the observation time %v", z.VolumesAt, z.At)
	}
	mustVolumes := func() {
		for _, s := range []func() error{
			func() error {
				return f.CreateOverlay(ctx, "rack1", lvspec.OverlaySpec{Pool: "default", Name: lvspec.OverlayVolume(name), BaseImage: DefaultImage})
			},
			func() error {
				return f.CreateSeed(ctx, "rack1", lvspec.SeedSpec{Pool: "default", Name: lvspec.SeedVolume(name)})
			},
		} {
			if err := s(); err != nil {
				t.Fatal(err)
			}
		}
	}
	mustVolumes()
	errIs(t, "define over foreign", f.DefineDomain(ctx, "rack1", domainSpec(name, marker("m-1", ""))), hypervisors.ErrExists)
	errIs(t, "marker on foreign", f.SetMarker(ctx, hypervisors.Target{Zone: "rack1", Name: name}, marker("m-1", "")), hypervisors.ErrNotOwned)
	vm, err := f.Lookup(ctx, hypervisors.Target{Zone: "rack1", Name: name})
	if err != nil || vm.Marker != nil {
		t.Errorf("foreign domain after refused define: %+v, %v", vm, err)
	}
}

func TestLibvirtOutOfBand(t *testing.T) {
	ctx := context.Background()
	f := NewLibvirt(Options{})
	defer f.Close()
	vm := hypervisors.Target{Zone: "fake-a", Name: "bf-a"}
	if err := f.AddOwnedVM("fake-a", "bf-a", marker("m-1", ""), observed.PowerRunning); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		do   func() error
		want observed.VM
	}{
		{"resize", func() error { return f.ResizeVM(vm, 8, 16384) }, observed.VM{Power: observed.PowerRunning, VCPU: 8, MemoryMiB: 16384}},
		{"pause", func() error { return f.PauseVM(vm) }, observed.VM{Power: observed.PowerPaused, VCPU: 8, MemoryMiB: 16384}},
		{"stop", func() error { return f.StopVM(vm) }, observed.VM{Power: observed.PowerStopped, VCPU: 8, MemoryMiB: 16384}},
		{"crash", func() error { return f.CrashVM(vm) }, observed.VM{Power: observed.PowerCrashed, VCPU: 8, MemoryMiB: 16384}},
	}
	for _, c := range cases {
		if err := c.do(); err != nil {
			t.Fatal(err)
		}
		got, err := f.Lookup(ctx, vm)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(c.want, observed.VM{Power: got.Power, VCPU: got.VCPU, MemoryMiB: got.MemoryMiB}); d != "" {
			t.Errorf("%s (-want +got)\n%s", c.name, d)
		}
	}
	if err := f.RemoveVM(vm); err != nil {
		t.Fatal(err)
	}
	_, err := f.Lookup(ctx, vm)
	errIs(t, "lookup removed", err, hypervisors.ErrNotFound)
	if got := len(f.Volumes("fake-a")); got != 1 { // the base image
		t.Errorf("volumes after RemoveVM: %d, want the base image only", got)
	}
}

// A seed volume created but never filled observes with no identity, is
// read the same way directly, and becomes a proper seed when CreateSeed
// runs again (as the libvirt adapter re-uploads).
func TestLibvirtBlankSeed(t *testing.T) {
	f := NewLibvirt(Options{Options: simcore.Options{Zones: []string{"rack1"}}})
	defer f.Close()
	ctx := context.Background()
	name := "bf-blank-cidata.iso"
	if err := f.AddBlankSeedVolume("rack1", "default", name); err != nil {
		t.Fatal(err)
	}
	blank := []*observed.Volume{{Zone: "rack1", Pool: "default", Name: name, Format: "iso"}}
	got, err := f.ReadVolumes(ctx, "rack1", "default", []string{name, "bf-absent"})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(blank, got); d != "" {
		t.Errorf("ReadVolumes (-want +got):\n%s", d)
	}
	spec := lvspec.SeedSpec{Pool: "default", Name: name, InstanceID: "m", Hostname: "h"}
	if err := f.CreateSeed(ctx, "rack1", spec); err != nil {
		t.Fatal(err)
	}
	z, err := f.Observe(ctx, "rack1")
	if err != nil {
		t.Fatal(err)
	}
	want := []*observed.Volume{{Zone: "rack1", Pool: "default", Name: name, Format: "iso", Identity: lvspec.SeedIdentity(spec)}}
	if d := cmp.Diff(want, z.Volumes); d != "" {
		t.Errorf("after CreateSeed (-want +got):\n%s", d)
	}
}

// TestOptionsShapeTheHosts: the host set's own Options (pool, base image,
// its format and size, network) are what every host holds, and a domain
// built from them starts; the zero value holds the documented defaults.
func TestOptionsShapeTheHosts(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name    string
		opts    Options
		want    []Volume
		network string
	}{
		{"defaults", Options{},
			[]Volume{{Pool: DefaultPool, Name: DefaultImage, Format: DefaultImageFormat, CapacityGiB: DefaultImageSizeGiB}}, DefaultNetwork},
		{"own settings", Options{Pool: "vms", Image: "base.raw", ImageFormat: "raw", ImageSizeGiB: 20, Network: "br0"},
			[]Volume{{Pool: "vms", Name: "base.raw", Format: "raw", CapacityGiB: 20}}, "br0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.opts.Zones = []string{"z"}
			f := NewLibvirt(c.opts)
			defer f.Close()
			if d := cmp.Diff(c.want, f.Volumes("z")); d != "" {
				t.Fatalf("volumes (-want +got):\n%s", d)
			}
			base := c.want[0]
			name := naming.VMName(inst, "m-1", 0)
			spec := domainSpec(name, marker("m-1", ""))
			spec.Pool, spec.Network = base.Pool, c.network
			steps := []func() error{
				func() error {
					return f.CreateOverlay(ctx, "z", lvspec.OverlaySpec{Pool: base.Pool, Name: spec.Overlay, BaseImage: base.Name})
				},
				func() error {
					return f.CreateSeed(ctx, "z", lvspec.SeedSpec{Pool: base.Pool, Name: spec.Seed, InstanceID: name, Hostname: name})
				},
				func() error { return f.DefineDomain(ctx, "z", spec) },
				func() error { return f.Start(ctx, hypervisors.Target{Zone: "z", Name: name}) },
			}
			for i, step := range steps {
				if err := step(); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
			}
		})
	}
}
