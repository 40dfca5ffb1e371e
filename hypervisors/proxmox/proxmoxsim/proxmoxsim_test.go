package proxmoxsim

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvemarker"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvespec"
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
	"github.com/bigfleet-vm/provider/naming"
	"github.com/bigfleet-vm/provider/observed"
)

var upidRE = regexp.MustCompile(`^UPID:[a-z0-9-]+:[0-9A-F]{8}:[0-9A-F]{8}:[0-9A-F]{8}:[a-z]+:[0-9]+:[^:]+:$`)

func template(zone string) *observed.VM {
	return &observed.VM{Zone: zone, Name: "bigfleet-template", VMID: DefaultTemplateVMID, Power: observed.PowerStopped,
		VCPU: 2, MemoryMiB: 2048, Template: true}
}

// TestProxmoxLifecycle walks clone, configure, drain and delete as the
// executor drives them, running every call twice.
func TestProxmoxLifecycle(t *testing.T) {
	ctx := context.Background()
	f := NewProxmox(Options{Options: simcore.Options{Zones: []string{"pve1", "pve2"}}})
	defer f.Close()
	name := naming.VMName(inst, "m-1", 0)
	m := marker("m-1", "")
	bound := marker("m-1", "c-1")
	vm := hypervisors.Target{Zone: "pve1", Name: name, VMID: FirstVMID}
	clone := func(power observed.Power, vcpu, mem int, mk observed.Marker, onboot bool) *observed.VM {
		return &observed.VM{Zone: "pve1", Name: name, VMID: FirstVMID, Marker: &mk, Power: power,
			VCPU: vcpu, MemoryMiB: mem, Autostart: onboot}
	}
	zone := func(vms ...*observed.VM) *observed.Zone {
		return &observed.Zone{Name: "pve1", Status: observed.StatusOK, VMs: append([]*observed.VM{}, vms...)}
	}
	exec := func(argv ...string) func() error {
		return func() error {
			r, err := f.AgentExec(ctx, vm, argv)
			if err == nil && r.ExitCode != 0 {
				t.Errorf("%v: exit %d: %s", argv, r.ExitCode, r.Stderr)
			}
			return err
		}
	}
	steps := []struct {
		name string
		run  func() error
		want *observed.Zone
	}{
		{"clone", func() error {
			id, err := f.CloneVM(ctx, "pve1", pvespec.CloneSpec{Name: name, TemplateVMID: DefaultTemplateVMID, Pool: "bigfleet", Marker: m})
			if err == nil && id != FirstVMID {
				return fmt.Errorf("clone got VMID %d, want %d", id, FirstVMID)
			}
			return err
		}, zone(clone(observed.PowerStopped, 2, 2048, m, false), template("pve1"))},
		{"configure-vm", func() error {
			return f.ConfigureVM(ctx, vm, pvespec.SizeSpec{VCPU: 4, MemoryMiB: 8192, OnBoot: true, Marker: m})
		}, zone(clone(observed.PowerStopped, 4, 8192, m, true), template("pve1"))},
		{"start", func() error { return f.Start(ctx, vm) }, zone(clone(observed.PowerRunning, 4, 8192, m, true), template("pve1"))},
		{"wait-agent", func() error { return f.AgentPing(ctx, vm) }, nil},
		{"set-marker", func() error { return f.SetMarker(ctx, vm, bound) }, nil},
		{"write-blob", func() error { return f.AgentWriteFile(ctx, vm, simcore.DefaultBootstrapPath, []byte("secret"), 0o700) }, nil},
		{"exec-bootstrap", exec("/bin/sh", simcore.DefaultBootstrapPath), nil},
		{"readiness", exec(simcore.DefaultReadyCommand), zone(clone(observed.PowerRunning, 4, 8192, bound, true), template("pve1"))},
		{"exec-drain", exec("kubectl", "drain", name), nil},
		{"unbind", func() error { return f.SetMarker(ctx, vm, m) }, nil},
		{"stop", func() error { return f.Stop(ctx, vm, time.Second) }, zone(clone(observed.PowerStopped, 4, 8192, m, true), template("pve1"))},
		{"delete", func() error { return f.DeleteVM(ctx, vm) }, zone(template("pve1"))},
	}
	for _, s := range steps {
		for try := range 2 {
			if err := s.run(); err != nil {
				t.Fatalf("%s (try %d): %v", s.name, try, err)
			}
			if s.want == nil {
				continue
			}
			got, err := f.Observe(ctx, "pve1")
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(s.want, got, ignoreAt); d != "" {
				t.Fatalf("%s (try %d): observed (-want +got)\n%s", s.name, try, d)
			}
		}
	}
	var types []string
	for _, task := range f.Tasks() {
		types = append(types, task.Type+":"+task.Status)
		if !upidRE.MatchString(task.UPID) {
			t.Errorf("malformed UPID %q", task.UPID)
		}
	}
	if d := cmp.Diff([]string{"qmclone:OK", "qmstart:OK", "qmshutdown:OK", "qmdestroy:OK"}, types); d != "" {
		t.Errorf("tasks (-want +got)\n%s", d)
	}
	z2, err := f.Observe(ctx, "pve2")
	if err != nil || len(z2.VMs) != 0 {
		t.Errorf("pve2: %+v, %v", z2, err)
	}
}

func TestProxmoxSemantics(t *testing.T) {
	ctx := context.Background()
	m := marker("m-1", "")
	spec := pvespec.CloneSpec{Name: "bf-x", TemplateVMID: DefaultTemplateVMID, Marker: m}
	vm := hypervisors.Target{Zone: "fake-a", VMID: FirstVMID}
	cloned := func(t *testing.T, f *Proxmox) {
		if _, err := f.CloneVM(ctx, "fake-a", spec); err != nil {
			t.Fatal(err)
		}
	}
	running := func(t *testing.T, f *Proxmox) {
		cloned(t, f)
		if err := f.Start(ctx, vm); err != nil {
			t.Fatal(err)
		}
	}
	locked := func(t *testing.T, f *Proxmox) { running(t, f); f.SetLock(vm, "backup") }
	other := observed.Marker{Installation: "other", MachineID: "m-1"}
	tmpl := hypervisors.Target{Zone: "fake-a", VMID: DefaultTemplateVMID}
	cases := []struct {
		name   string
		opts   simcore.Options
		setup  func(*testing.T, *Proxmox)
		call   func(*Proxmox) error
		want   error
		repeat bool // the repeated call gives the same class
	}{
		{"clone missing template", simcore.Options{}, nil, func(f *Proxmox) error {
			s := spec
			s.TemplateVMID = 9999
			_, err := f.CloneVM(ctx, "fake-a", s)
			return err
		}, hypervisors.ErrNotFound, true},
		{"clone from a non-template", simcore.Options{}, func(t *testing.T, f *Proxmox) { f.AddForeignVM("fake-a", 500, "vm", nil) }, func(f *Proxmox) error {
			s := spec
			s.TemplateVMID = 500
			_, err := f.CloneVM(ctx, "fake-a", s)
			return err
		}, hypervisors.ErrInvalid, true},
		{"clone with create fault", simcore.Options{Faults: true}, nil, func(f *Proxmox) error {
			s := spec
			s.Labels = map[string]string{simcore.CreateFaultLabel: "error"}
			_, err := f.CloneVM(ctx, "fake-a", s)
			return err
		}, hypervisors.ErrInvalid, true},
		{"create fault label without faults", simcore.Options{}, nil, func(f *Proxmox) error {
			s := spec
			s.Labels = map[string]string{simcore.CreateFaultLabel: "error"}
			_, err := f.CloneVM(ctx, "fake-a", s)
			return err
		}, nil, true},
		{"clone of a machine living on another node", simcore.Options{}, cloned, func(f *Proxmox) error {
			_, err := f.CloneVM(ctx, "fake-b", spec)
			return err
		}, hypervisors.ErrExists, true},
		{"clone without marker", simcore.Options{}, nil, func(f *Proxmox) error {
			_, err := f.CloneVM(ctx, "fake-a", pvespec.CloneSpec{Name: "x", TemplateVMID: DefaultTemplateVMID})
			return err
		}, hypervisors.ErrInvalid, true},
		{"configure a foreign VM", simcore.Options{}, func(t *testing.T, f *Proxmox) { f.AddForeignVM("fake-a", FirstVMID, "bf-x", &other) }, func(f *Proxmox) error {
			return f.ConfigureVM(ctx, vm, pvespec.SizeSpec{VCPU: 1, MemoryMiB: 512, Marker: m})
		}, hypervisors.ErrNotOwned, true},
		{"configure an unmarked VM", simcore.Options{}, func(t *testing.T, f *Proxmox) { f.AddForeignVM("fake-a", FirstVMID, "bf-x", nil) }, func(f *Proxmox) error {
			return f.SetMarker(ctx, vm, m)
		}, hypervisors.ErrNotOwned, true},
		{"configure the template", simcore.Options{}, nil, func(f *Proxmox) error {
			return f.ConfigureVM(ctx, tmpl, pvespec.SizeSpec{VCPU: 1, MemoryMiB: 512, Marker: m})
		}, hypervisors.ErrInvalid, true},
		{"delete running", simcore.Options{}, running, func(f *Proxmox) error { return f.DeleteVM(ctx, vm) }, hypervisors.ErrInvalid, true},
		{"delete missing", simcore.Options{}, nil, func(f *Proxmox) error { return f.DeleteVM(ctx, vm) }, nil, true},
		{"delete the template", simcore.Options{}, nil, func(f *Proxmox) error { return f.DeleteVM(ctx, tmpl) }, hypervisors.ErrInvalid, true},
		{"start the template", simcore.Options{}, nil, func(f *Proxmox) error { return f.Start(ctx, tmpl) }, hypervisors.ErrInvalid, true},
		{"start missing", simcore.Options{}, nil, func(f *Proxmox) error { return f.Start(ctx, vm) }, hypervisors.ErrNotFound, true},
		{"stop missing", simcore.Options{}, nil, func(f *Proxmox) error { return f.Stop(ctx, vm, 0) }, nil, true},
		{"stop paused forces after grace", simcore.Options{}, func(t *testing.T, f *Proxmox) { running(t, f); f.PauseVM(vm) },
			func(f *Proxmox) error { return f.Stop(ctx, vm, time.Millisecond) }, nil, true},
		{"start crashed", simcore.Options{}, func(t *testing.T, f *Proxmox) { running(t, f); f.CrashVM(vm) },
			func(f *Proxmox) error { return f.Start(ctx, vm) }, nil, true},
		{"resume stopped", simcore.Options{}, cloned, func(f *Proxmox) error { return f.Resume(ctx, vm) }, hypervisors.ErrInvalid, true},
		{"locked start", simcore.Options{}, func(t *testing.T, f *Proxmox) { cloned(t, f); f.SetLock(vm, "backup") },
			func(f *Proxmox) error { return f.Start(ctx, vm) }, hypervisors.ErrLocked, true},
		{"locked stop", simcore.Options{}, locked, func(f *Proxmox) error { return f.Stop(ctx, vm, 0) }, hypervisors.ErrLocked, true},
		{"locked configure", simcore.Options{}, locked, func(f *Proxmox) error {
			return f.ConfigureVM(ctx, vm, pvespec.SizeSpec{VCPU: 1, MemoryMiB: 512, Marker: m})
		}, hypervisors.ErrLocked, true},
		{"locked marker", simcore.Options{}, locked, func(f *Proxmox) error { return f.SetMarker(ctx, vm, m) }, hypervisors.ErrLocked, true},
		{"locked onboot", simcore.Options{}, locked, func(f *Proxmox) error { return f.SetAutostart(ctx, vm, true) }, hypervisors.ErrLocked, true},
		{"locked delete", simcore.Options{}, func(t *testing.T, f *Proxmox) { cloned(t, f); f.SetLock(vm, "backup") },
			func(f *Proxmox) error { return f.DeleteVM(ctx, vm) }, hypervisors.ErrLocked, true},
		{"locked clone adoption", simcore.Options{}, func(t *testing.T, f *Proxmox) { cloned(t, f); f.SetLock(vm, "clone") },
			func(f *Proxmox) error { _, err := f.CloneVM(ctx, "fake-a", spec); return err }, hypervisors.ErrLocked, true},
		{"agent works on a locked VM", simcore.Options{}, locked, func(f *Proxmox) error { return f.AgentPing(ctx, vm) }, nil, true},
		{"lookup on the wrong node", simcore.Options{}, cloned, func(f *Proxmox) error {
			_, err := f.Lookup(ctx, hypervisors.Target{Zone: "fake-b", VMID: FirstVMID})
			return err
		}, hypervisors.ErrNotFound, true},
		{"unknown node", simcore.Options{}, nil, func(f *Proxmox) error { _, err := f.Observe(ctx, "mars"); return err }, hypervisors.ErrInvalid, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := NewProxmox(Options{Options: c.opts})
			defer f.Close()
			if c.setup != nil {
				c.setup(t, f)
			}
			errIs(t, c.name, c.call(f), c.want)
			if c.repeat {
				errIs(t, c.name+" (repeat)", c.call(f), c.want)
			}
		})
	}
}

// TestProxmoxVMIDs: VMIDs skip taken ones, foreign VMs are observed
// without a marker unless their tags match the installation in their
// description, and concurrent clones never share a VMID.
func TestProxmoxVMIDs(t *testing.T) {
	ctx := context.Background()
	f := NewProxmox(Options{Options: simcore.Options{Zones: []string{"pve1"}, Latency: 2 * time.Millisecond}})
	defer f.Close()
	other := observed.Marker{Installation: "other", MachineID: "x"}
	f.AddForeignVM("pve1", 100, "bf-inst-1-m-1", nil)
	f.AddForeignVM("pve1", 101, "theirs", &other)
	// Description says ours, but the tags were stripped: not a marker.
	f.AddForeignVM("pve1", 102, "half", nil)
	f.oob(hypervisors.Target{Zone: "pve1", VMID: 102}, func(v *pveVM) { v.Description = pvemarker.Description(marker("m-9", "")) })

	var wg sync.WaitGroup
	ids := make([]int, 6)
	errs := make([]error, 6)
	for i := range ids {
		wg.Go(func() {
			mid := fmt.Sprintf("m-%d", i)
			ids[i], errs[i] = f.CloneVM(ctx, "pve1", pvespec.CloneSpec{Name: "bf-" + mid, TemplateVMID: DefaultTemplateVMID, Marker: marker(mid, "")})
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	sort.Ints(ids)
	if d := cmp.Diff([]int{103, 104, 105, 106, 107, 108}, ids); d != "" {
		t.Errorf("allocated VMIDs (-want +got)\n%s", d)
	}
	z, err := f.Observe(ctx, "pve1")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, vm := range z.VMs {
		owner := "-"
		if vm.Marker != nil {
			owner = vm.Marker.Installation + "/" + vm.Marker.MachineID
		}
		got = append(got, fmt.Sprintf("%d %s", vm.VMID, owner))
	}
	want := []string{"100 -", "101 other/x", "102 -", "103 inst-1/m-0", "104 inst-1/m-1", "105 inst-1/m-2",
		"106 inst-1/m-3", "107 inst-1/m-4", "108 inst-1/m-5", "9000 -"}
	// Which machine got which VMID depends on scheduling; the set of
	// owners does not.
	for i := range got[3:9] {
		got[3+i] = got[3+i][:4] + "inst-1/m-?"
		want[3+i] = want[3+i][:4] + "inst-1/m-?"
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("observed (-want +got)\n%s", d)
	}
}

// TestProxmoxConcurrentCloneOfOneMachine: retried clones racing each other
// converge on one VM.
func TestProxmoxConcurrentCloneOfOneMachine(t *testing.T) {
	ctx := context.Background()
	f := NewProxmox(Options{Options: simcore.Options{Latency: 2 * time.Millisecond}})
	defer f.Close()
	spec := pvespec.CloneSpec{Name: "bf-m", TemplateVMID: DefaultTemplateVMID, Marker: marker("m", "")}
	var wg sync.WaitGroup
	ids := make([]int, 5)
	errs := make([]error, 5)
	for i := range ids {
		wg.Go(func() { ids[i], errs[i] = f.CloneVM(ctx, "fake-a", spec) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil && !errors.Is(err, hypervisors.ErrLocked) {
			t.Errorf("clone %d: %v", i, err)
		}
		if err == nil && ids[i] != FirstVMID {
			t.Errorf("clone %d: VMID %d", i, ids[i])
		}
	}
	id, err := f.CloneVM(ctx, "fake-a", spec)
	if err != nil || id != FirstVMID {
		t.Fatalf("settled clone: %d, %v", id, err)
	}
	z, _ := f.Observe(ctx, "fake-a")
	if len(z.VMs) != 2 {
		t.Errorf("VMs after racing clones: %d, want the clone and the template", len(z.VMs))
	}
}

// blockTask returns a hook that holds every task of typ until release is
// closed, and a channel that receives once per held task.
func blockTask(typ string) (simcore.Hook, chan struct{}, chan struct{}) {
	started, release := make(chan struct{}, 8), make(chan struct{})
	return func(_ context.Context, c simcore.Call) error {
		if c.Op == "task/"+typ {
			started <- struct{}{}
			<-release
		}
		return nil
	}, started, release
}

func TestProxmoxTaskLocks(t *testing.T) {
	ctx := context.Background()
	f := NewProxmox(Options{})
	defer f.Close()
	m := marker("m", "")
	id, err := f.CloneVM(ctx, "fake-a", pvespec.CloneSpec{Name: "bf-m", TemplateVMID: DefaultTemplateVMID, Marker: m})
	if err != nil {
		t.Fatal(err)
	}
	vm := hypervisors.Target{Zone: "fake-a", VMID: id}
	hook, started, release := blockTask("qmstart")
	f.SetHook(hook)
	done := make(chan error, 1)
	go func() { done <- f.Start(ctx, vm) }()
	<-started
	size := pvespec.SizeSpec{VCPU: 2, MemoryMiB: 2048, Marker: m}
	errIs(t, "configure while starting", f.ConfigureVM(ctx, vm, size), hypervisors.ErrLocked)
	errIs(t, "delete while starting", f.DeleteVM(ctx, vm), hypervisors.ErrLocked)
	errIs(t, "start while starting", f.Start(ctx, vm), hypervisors.ErrLocked)
	got, err := f.Lookup(ctx, vm)
	if err != nil || got.Power != observed.PowerStopped {
		t.Errorf("during qmstart: %+v, %v", got, err)
	}
	close(release)
	errIs(t, "start", <-done, nil)
	errIs(t, "configure after start", f.ConfigureVM(ctx, vm, size), nil)
}

func TestProxmoxTasks(t *testing.T) {
	ctx := context.Background()
	m := marker("m", "")
	spec := pvespec.CloneSpec{Name: "bf-m", TemplateVMID: DefaultTemplateVMID, Marker: m}
	vm := hypervisors.Target{Zone: "fake-a", VMID: FirstVMID}

	t.Run("failed start", func(t *testing.T) {
		f := NewProxmox(Options{})
		defer f.Close()
		if _, err := f.CloneVM(ctx, "fake-a", spec); err != nil {
			t.Fatal(err)
		}
		f.SetHook(simcore.FailN("task/qmstart", 1, fmt.Errorf("start failed: timeout waiting on systemd: %w", hypervisors.ErrTransient)))
		errIs(t, "start", f.Start(ctx, vm), hypervisors.ErrTransient)
		got, _ := f.Lookup(ctx, vm)
		if got.Power != observed.PowerStopped {
			t.Errorf("power after failed start: %s", got.Power)
		}
		errIs(t, "start again", f.Start(ctx, vm), nil)
		tasks := f.Tasks()
		if d := cmp.Diff([]string{"OK", "start failed: timeout waiting on systemd: transient failure", "OK"},
			[]string{tasks[0].Status, tasks[1].Status, tasks[2].Status}); d != "" {
			t.Errorf("task status (-want +got)\n%s", d)
		}
	})
	t.Run("failed clone leaves nothing", func(t *testing.T) {
		f := NewProxmox(Options{Options: simcore.Options{Hook: simcore.FailN("task/qmclone", 1, errors.New("storage full"))}})
		defer f.Close()
		_, err := f.CloneVM(ctx, "fake-a", spec)
		if err == nil {
			t.Fatal("clone succeeded")
		}
		if z, _ := f.Observe(ctx, "fake-a"); len(z.VMs) != 1 {
			t.Errorf("VMs after failed clone: %d, want the template", len(z.VMs))
		}
		id, err := f.CloneVM(ctx, "fake-a", spec)
		if err != nil || id != FirstVMID {
			t.Errorf("retry: %d, %v", id, err)
		}
	})
	t.Run("abandoned wait", func(t *testing.T) {
		f := NewProxmox(Options{})
		if _, err := f.CloneVM(ctx, "fake-a", spec); err != nil {
			t.Fatal(err)
		}
		hook, started, release := blockTask("qmdestroy")
		f.SetHook(hook)
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- f.DeleteVM(cctx, vm) }()
		<-started
		cancel()
		errIs(t, "delete", <-done, context.Canceled)
		if _, err := f.Lookup(ctx, vm); err != nil {
			t.Errorf("VM gone while its destroy task still runs: %v", err)
		}
		close(release)
		f.Close() // waits for the task
		f.c.Lock()
		n := len(f.vms)
		f.c.Unlock()
		if n != 1 {
			t.Errorf("VMs after destroy task finished: %d, want the template", n)
		}
	})
}

// TestOptionsPlaceTheTemplates: the cluster's own Options place the
// template on the first node and every extra Template on its node (the
// first when it names none), sized by the template's own size or the
// Options'; the zero value places the documented default template.
func TestOptionsPlaceTheTemplates(t *testing.T) {
	ctx := context.Background()
	tmpl := func(zone string, vmid, vcpu, mem int, name string) *observed.VM {
		return &observed.VM{Zone: zone, Name: name, VMID: vmid, Power: observed.PowerStopped, VCPU: vcpu, MemoryMiB: mem, Template: true}
	}
	cases := []struct {
		name string
		opts Options
		want map[string][]*observed.VM
	}{
		{"defaults", Options{}, map[string][]*observed.VM{
			"fake-a": {tmpl("fake-a", DefaultTemplateVMID, DefaultTemplateVCPU, DefaultTemplateMemory, "bigfleet-template")},
		}},
		{"own settings", Options{TemplateVMID: 7000, TemplateVCPU: 1, TemplateMemory: 512, Templates: []Template{
			{VMID: 7001, Zone: "fake-b", Name: "big", VCPU: 8, MemoryMiB: 16384},
			{VMID: 7002, Name: "small"},
		}}, map[string][]*observed.VM{
			"fake-a": {tmpl("fake-a", 7000, 1, 512, "bigfleet-template"), tmpl("fake-a", 7002, 1, 512, "small")},
			"fake-b": {tmpl("fake-b", 7001, 8, 16384, "big")},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := NewProxmox(c.opts)
			defer f.Close()
			for _, zone := range []string{"fake-a", "fake-b"} {
				z, err := f.Observe(ctx, zone)
				if err != nil {
					t.Fatal(err)
				}
				if d := cmp.Diff(c.want[zone], z.VMs); d != "" {
					t.Errorf("%s (-want +got):\n%s", zone, d)
				}
			}
		})
	}
}
