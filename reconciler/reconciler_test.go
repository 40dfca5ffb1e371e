package reconciler

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/executor"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/libvirtsim"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/proxmoxsim"
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
	"github.com/bigfleet-vm/provider/naming"
	"github.com/bigfleet-vm/provider/planner"
)

type rig struct {
	doc  *desired.Document
	hv   hypervisors.Hypervisor
	rec  *Reconciler
	stop func()
}

func newRig(t *testing.T, shape string, mem *desired.MemoryStore, fo simcore.Options, tune ...func(*Options)) *rig {
	t.Helper()
	fo.Zones = []string{"z1"}
	var hv hypervisors.Hypervisor
	pc := planner.Config{Installation: "inst", StopGrace: time.Second, ReapFailed: true}
	if shape == "libvirt" {
		hv = libvirtsim.NewLibvirt(libvirtsim.Options{Options: fo})
		pc.Plugin = libvirt.Planner(libvirt.PlanSettings{Pool: "default", Image: "golden.qcow2", Network: "default", DomainType: "kvm"})
	} else {
		hv = proxmoxsim.NewProxmox(proxmoxsim.Options{Options: fo})
		pc.Plugin = proxmox.Planner(proxmox.PlanSettings{BootstrapPath: "/run/bigfleet-bootstrap", BootstrapExec: []string{"/bin/sh"}})
	}
	var slots []desired.Slot
	for i := 0; i < 4; i++ {
		slots = append(slots, desired.Slot{ID: fmt.Sprintf("z1/t/%03d", i), Zone: "z1", InstanceType: "t", Capacity: desired.OnDemand,
			VCPU: 2, MemoryMiB: 2048, Source: 9000})
	}
	r := &rig{hv: hv}
	doc, _, err := desired.Open(context.Background(), desired.Options{Store: mem, DefaultInstallation: "inst", DeleteSupported: true, VMName: naming.VMName,
		Timeouts: map[desired.Kind]time.Duration{desired.KindCreate: 5 * time.Second, desired.KindConfigure: 2 * time.Second,
			desired.KindDrain: 5 * time.Second, desired.KindDelete: 5 * time.Second},
		Notify: func(id string) { r.rec.Enqueue(id) }}, slots)
	if err != nil {
		t.Fatal(err)
	}
	r.doc = doc
	ex := executor.New(executor.Options{Hypervisor: hv, Installation: "inst", Blob: doc.Blob, MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	o := Options{Doc: doc, Hypervisor: hv, Executor: ex, Planner: pc, Interval: 50 * time.Millisecond, Workers: 4}
	for _, f := range tune {
		f(&o)
	}
	r.rec = New(o)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.rec.Run(ctx, ctx); close(done) }()
	r.stop = func() { cancel(); <-done }
	t.Cleanup(r.stop)
	return r
}

func (r *rig) mutate(t *testing.T, req desired.Request) desired.Ack {
	t.Helper()
	a, err := r.doc.Mutate(context.Background(), req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Kind, req.MachineID, err)
	}
	return a
}

func (r *rig) await(t *testing.T, id string, want desired.State) *desired.Machine {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if m := r.doc.Get(id); m.State == want {
			return m
		}
		time.Sleep(5 * time.Millisecond)
	}
	m := r.doc.Get(id)
	t.Fatalf("%s: state %s (last_error %q), want %s", id, m.State, m.LastError, want)
	return nil
}

func TestLifecycleBothShapes(t *testing.T) {
	for _, shape := range []string{"libvirt", "proxmox"} {
		t.Run(string(shape), func(t *testing.T) {
			r := newRig(t, shape, desired.NewMemoryStore(nil), simcore.Options{})
			id := "z1/t/000"
			r.mutate(t, desired.Request{Kind: desired.KindCreate, MachineID: id})
			m := r.await(t, id, desired.Idle)
			if m.Host == "" {
				t.Fatal("IDLE without host")
			}
			r.mutate(t, desired.Request{Kind: desired.KindConfigure, MachineID: id, Cluster: "c1", Blob: []byte("join-secret")})
			r.await(t, id, desired.Configured)
			tg := hypervisors.Target{Zone: "z1", Name: m.VMName, VMID: m.VMID}
			type bootstrapper interface {
				Bootstraps(hypervisors.Target) []simcore.Bootstrap
			}
			bs := r.hv.(bootstrapper).Bootstraps(tg)
			if len(bs) != 1 || string(bs[0].Blob) != "join-secret" || bs[0].Cluster != "c1" {
				t.Fatalf("bootstraps: %+v", bs)
			}
			r.mutate(t, desired.Request{Kind: desired.KindDrain, MachineID: id, Grace: 0})
			r.await(t, id, desired.Idle)
			r.mutate(t, desired.Request{Kind: desired.KindDelete, MachineID: id})
			r.await(t, id, desired.Speculative)
			if _, err := r.hv.Lookup(context.Background(), tg); err == nil {
				t.Fatal("VM still exists after Delete")
			}
		})
	}
}

func TestHookFailureIsScrubbedAndSticky(t *testing.T) {
	r := newRig(t, "libvirt", desired.NewMemoryStore(nil), simcore.Options{Faults: true})
	id := "z1/t/001"
	r.mutate(t, desired.Request{Kind: desired.KindCreate, MachineID: id})
	r.await(t, id, desired.Idle)
	r.mutate(t, desired.Request{Kind: desired.KindConfigure, MachineID: id, Cluster: "fault-error", Blob: []byte("top-secret-token")})
	m := r.await(t, id, desired.Failed)
	if !strings.Contains(m.LastError, "bootstrap hook exited") || strings.Contains(m.LastError, "top-secret-token") {
		t.Fatalf("last_error %q", m.LastError)
	}
}

func TestVanishedVMFailsAndStoppedVMIsRestarted(t *testing.T) {
	r := newRig(t, "libvirt", desired.NewMemoryStore(nil), simcore.Options{})
	sim := r.hv.(*libvirtsim.Libvirt)
	a, b := "z1/t/000", "z1/t/001"
	r.mutate(t, desired.Request{Kind: desired.KindCreate, MachineID: a})
	r.mutate(t, desired.Request{Kind: desired.KindCreate, MachineID: b})
	ma, mb := r.await(t, a, desired.Idle), r.await(t, b, desired.Idle)
	ta := hypervisors.Target{Zone: "z1", Name: ma.VMName}
	if err := sim.StopVM(ta); err != nil {
		t.Fatal(err)
	}
	if err := sim.RemoveVM(hypervisors.Target{Zone: "z1", Name: mb.VMName}); err != nil {
		t.Fatal(err)
	}
	r.await(t, b, desired.Failed)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		vm, err := sim.Lookup(context.Background(), ta)
		if err == nil && vm.Power == "running" {
			if r.doc.Get(a).State != desired.Idle {
				t.Fatal("a repaired machine must stay IDLE")
			}
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("stopped VM was not started again")
}

// --drift-repair-delay holds a repair back until the drift has lasted that
// long, also when the machine is woken directly (as an adapter event
// does), not only when a full pass finds it.
func TestRepairDelayHoldsEveryRepair(t *testing.T) {
	const delay = 400 * time.Millisecond
	r := newRig(t, "libvirt", desired.NewMemoryStore(nil), simcore.Options{}, func(o *Options) {
		o.RepairDelay, o.Interval = delay, time.Hour
	})
	sim := r.hv.(*libvirtsim.Libvirt)
	id := "z1/t/000"
	r.mutate(t, desired.Request{Kind: desired.KindCreate, MachineID: id})
	m := r.await(t, id, desired.Idle)
	tg := hypervisors.Target{Zone: "z1", Name: m.VMName}
	if err := sim.StopVM(tg); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	r.rec.Enqueue(id) // what a lifecycle event does
	running := func() bool {
		vm, err := sim.Lookup(context.Background(), tg)
		return err == nil && vm.Power == "running"
	}
	for time.Since(stopped) < delay/2 {
		if running() {
			t.Fatalf("repaired %v after the stop, before the %v delay", time.Since(stopped), delay)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if running() {
			if el := time.Since(stopped); el < delay {
				t.Errorf("repaired %v after the stop, before the %v delay", el, delay)
			}
			return
		}
	}
	t.Fatal("the stopped VM was never started again")
}

func TestRestartRedrivesCreate(t *testing.T) {
	mem := desired.NewMemoryStore(nil)
	// The first provider accepts a Create but its hypervisor is slow; it
	// stops before the transition finishes.
	r := newRig(t, "proxmox", mem, simcore.Options{Latency: time.Hour})
	id := "z1/t/002"
	op := r.mutate(t, desired.Request{Kind: desired.KindCreate, MachineID: id}).OpID
	r.stop()
	r2 := newRig(t, "proxmox", desired.NewMemoryStore(snapshot(t, mem)), simcore.Options{})
	m := r2.await(t, id, desired.Idle)
	if m.Ops[desired.KindCreate].ID != op {
		t.Fatalf("op %s, want %s", m.Ops[desired.KindCreate].ID, op)
	}
}

func snapshot(t *testing.T, s desired.Store) map[string][]byte {
	t.Helper()
	m, err := s.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestHostFitHoldsACreate: a Create its HostFit refuses fails with the
// answer as last_error before any step makes its VM; a Create whose
// start the hypervisor refuses for lack of host resources fails with
// HostFit's naming of it, not the raw error.
func TestHostFitHoldsACreate(t *testing.T) {
	fit := func(o *Options) {
		o.HostFit = func(m *desired.Machine, err error) string {
			switch {
			case m.ID == "z1/t/000" && err == nil:
				return "host memory: zone z1 has 1024 MiB free, the machine needs 2048 MiB"
			case err != nil:
				return "host memory: named with the figures"
			}
			return ""
		}
	}
	r := newRig(t, "libvirt", desired.NewMemoryStore(nil), simcore.Options{}, fit)
	lv := r.hv.(*libvirtsim.Libvirt)
	r.mutate(t, desired.Request{Kind: desired.KindCreate, MachineID: "z1/t/000"})
	m := r.await(t, "z1/t/000", desired.Failed)
	if want := "create failed: host memory: zone z1 has 1024 MiB free, the machine needs 2048 MiB"; m.LastError != want {
		t.Fatalf("last_error %q, want %q", m.LastError, want)
	}
	for _, op := range []string{"CreateOverlay", "CreateSeed", "DefineDomain"} {
		if n := lv.Calls()[op]; n != 0 {
			t.Errorf("%d %s calls for a Create the host cannot hold, want 0", n, op)
		}
	}
	lv.SetHook(func(_ context.Context, c simcore.Call) error {
		if c.Op == "Start" {
			return &hypervisors.ResourceError{Resource: "memory", Err: fmt.Errorf("cannot set up guest memory 'pc.ram': Cannot allocate memory")}
		}
		return nil
	})
	r.mutate(t, desired.Request{Kind: desired.KindCreate, MachineID: "z1/t/001"})
	m = r.await(t, "z1/t/001", desired.Failed)
	if want := "create failed: host memory: named with the figures"; m.LastError != want {
		t.Fatalf("last_error %q, want %q", m.LastError, want)
	}
}
