package executor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/libvirtsim"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/proxmoxsim"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvespec"
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/planner"
)

// libvirtCreate is the planner's libvirt create for one VM: two
// independent volumes, then a chain.
func libvirtCreate(name string) []planner.Step {
	tg := hypervisors.Target{Zone: "z", Name: name}
	mk := observed.Marker{Installation: inst, MachineID: "m-" + name}
	overlay, seed := lvspec.OverlayVolume(name), lvspec.SeedVolume(name)
	disk := planner.Step{ID: "z/" + name + "/create-overlay:disk", Action: planner.Action(lvspec.ActionCreateOverlay), Target: tg,
		Params: planner.Params{Plugin: &lvspec.OverlaySpec{Pool: libvirtsim.DefaultPool, Name: overlay, BaseImage: libvirtsim.DefaultImage}}}
	cidata := planner.Step{ID: "z/" + name + "/create-seed:cidata", Action: planner.Action(lvspec.ActionCreateSeed), Target: tg,
		Params: planner.Params{Plugin: &lvspec.SeedSpec{Pool: libvirtsim.DefaultPool, Name: seed, InstanceID: name, Hostname: name}}}
	define := planner.Step{ID: "z/" + name + "/define", Action: planner.Action(lvspec.ActionDefine), Target: tg, DependsOn: []string{disk.ID, cidata.ID},
		Params: planner.Params{Plugin: &lvspec.DomainSpec{Name: name, VCPU: 2, MemoryMiB: 2048, DomainType: "kvm",
			Pool: libvirtsim.DefaultPool, Overlay: overlay, Seed: seed, Network: libvirtsim.DefaultNetwork, Marker: mk}}}
	rest := chain(define,
		step(planner.ActionStart, tg, planner.Params{}),
		step(planner.Action(lvspec.ActionAutostart), tg, planner.Params{Plugin: &lvspec.Autostart{On: true}}),
		step(planner.ActionWaitAgent, tg, planner.Params{}))
	return append([]planner.Step{disk, cidata}, rest...)
}

func TestGraphIsValidated(t *testing.T) {
	tg := hypervisors.Target{Zone: "z", Name: "vm"}
	a := step(planner.ActionStart, tg, planner.Params{})
	b := step(planner.ActionWaitAgent, tg, planner.Params{})
	with := func(s planner.Step, deps ...string) planner.Step { s.DependsOn = deps; return s }
	tests := []struct {
		name  string
		steps []planner.Step
	}{
		{"duplicate id", []planner.Step{a, a}},
		{"dangling dependency", []planner.Step{a, with(b, "z/vm/define")}},
		{"self cycle", []planner.Step{with(a, a.ID)}},
		{"two-step cycle", []planner.Step{with(a, b.ID), with(b, a.ID)}},
		{"cycle behind a good step", []planner.Step{step(planner.ActionResume, tg, planner.Params{}), with(a, b.ID, "z/vm/resume"), with(b, a.ID)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hv := libvirtsim.NewLibvirt(libvirtsim.Options{Options: simcore.Options{Zones: []string{"z"}}})
			_, err := newExec(hv, nil).Run(context.Background(), planner.Change{Machine: "m", Steps: tc.steps}, "op")
			if !errors.Is(err, hypervisors.ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			if calls := hv.Calls(); len(calls) != 0 {
				t.Errorf("an invalid graph ran steps: %v", calls)
			}
		})
	}
}

// The order of the slice does not matter: every permutation of a create
// converges on the same world as the planner's order.
func TestShuffledStepsConverge(t *testing.T) {
	observe := func(hv *libvirtsim.Libvirt) *observed.Zone {
		z, err := hv.Observe(context.Background(), "z")
		if err != nil {
			t.Fatal(err)
		}
		return z
	}
	ordered := libvirtsim.NewLibvirt(libvirtsim.Options{Options: simcore.Options{Zones: []string{"z"}}})
	if _, err := newExec(ordered, nil).Run(context.Background(), planner.Change{Machine: "m-vm", Steps: libvirtCreate("vm")}, "op"); err != nil {
		t.Fatal(err)
	}
	want := observe(ordered)
	if len(want.VMs) != 1 || want.VMs[0].Power != observed.PowerRunning {
		t.Fatalf("ordered run left %+v", want.VMs)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20 {
		steps := libvirtCreate("vm")
		rng.Shuffle(len(steps), func(a, b int) { steps[a], steps[b] = steps[b], steps[a] })
		hv := libvirtsim.NewLibvirt(libvirtsim.Options{Options: simcore.Options{Zones: []string{"z"}}})
		if _, err := newExec(hv, nil).Run(context.Background(), planner.Change{Machine: "m-vm", Steps: steps}, "op"); err != nil {
			t.Fatalf("permutation %d: %v", i, err)
		}
		if diff := cmp.Diff(want, observe(hv), cmpopts.IgnoreFields(observed.Zone{}, "At", "VolumesAt")); diff != "" {
			t.Fatalf("permutation %d (-want +got):\n%s", i, diff)
		}
	}
}

// The VMID a clone learns reaches its dependants even when they come
// first in the slice.
func TestVMIDFlowsAlongDependencies(t *testing.T) {
	hv := proxmoxsim.NewProxmox(proxmoxsim.Options{Options: simcore.Options{Zones: []string{"z"}}})
	mk := observed.Marker{Installation: inst, MachineID: "m"}
	tg := hypervisors.Target{Zone: "z", Name: "vm"}
	steps := chain(
		step(planner.Action(pvespec.ActionClone), tg, planner.Params{Plugin: &pvespec.CloneSpec{Name: "vm", TemplateVMID: 9000, Marker: mk}}),
		step(planner.Action(pvespec.ActionConfigureVM), tg, planner.Params{Plugin: &pvespec.SizeSpec{VCPU: 4, MemoryMiB: 4096, OnBoot: true, Marker: mk}}),
		step(planner.ActionStart, tg, planner.Params{}),
	)
	steps[0], steps[2] = steps[2], steps[0]
	out, err := newExec(hv, nil).Run(context.Background(), planner.Change{Machine: "m", Steps: steps}, "op")
	if err != nil || out.VMID == 0 {
		t.Fatalf("run: %v %+v", err, out)
	}
	vm, err := hv.Lookup(context.Background(), hypervisors.Target{Zone: "z", VMID: out.VMID})
	if err != nil || vm.VCPU != 4 || vm.Power != observed.PowerRunning {
		t.Fatalf("vm: %v %+v", err, vm)
	}
}

// barrier lets n calls of the given ops through only once all n are in
// flight together; a scheduler that ran them one after another would
// never release them (the test's context ends the wait as a failure).
func barrier(n int, ops ...string) (simcore.Hook, func() int) {
	var mu sync.Mutex
	arrived := 0
	all := make(chan struct{})
	match := map[string]bool{}
	for _, op := range ops {
		match[op] = true
	}
	return func(ctx context.Context, c simcore.Call) error {
			if !match[c.Op] {
				return nil
			}
			mu.Lock()
			arrived++
			if arrived == n {
				close(all)
			}
			mu.Unlock()
			select {
			case <-all:
				return nil
			case <-ctx.Done():
				return fmt.Errorf("%s waited alone at the barrier: %w", c.Op, hypervisors.ErrInvalid)
			}
		}, func() int {
			mu.Lock()
			defer mu.Unlock()
			return arrived
		}
}

func TestIndependentStepsOverlap(t *testing.T) {
	hook, _ := barrier(2, "CreateOverlay", "CreateSeed")
	hv := libvirtsim.NewLibvirt(libvirtsim.Options{Options: simcore.Options{Zones: []string{"z"}, Hook: hook}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := newExec(hv, nil).Run(ctx, planner.Change{Machine: "m-vm", Steps: libvirtCreate("vm")}, "op"); err != nil {
		t.Fatalf("the two volumes did not run together: %v", err)
	}
}

// inflight records the most heavy calls in flight at once. Each call
// stays until the bound is reached (proving calls do overlap up to it) or
// a while has passed (so that a broken bound lets more pile up).
func inflight(bound int) (simcore.Hook, func() int) {
	var mu sync.Mutex
	cur, peak := 0, 0
	full := make(chan struct{})
	return func(ctx context.Context, c simcore.Call) error {
			if c.Op != "CreateOverlay" && c.Op != "CreateSeed" {
				return nil
			}
			mu.Lock()
			cur++
			peak = max(peak, cur)
			if cur == bound {
				select {
				case <-full:
				default:
					close(full)
				}
			}
			mu.Unlock()
			select {
			case <-full:
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
			}
			mu.Lock()
			cur--
			mu.Unlock()
			return nil
		}, func() int {
			mu.Lock()
			defer mu.Unlock()
			return peak
		}
}

func TestPerZoneBoundHolds(t *testing.T) {
	for _, bound := range []int{1, 2, 3} {
		t.Run(fmt.Sprint(bound), func(t *testing.T) {
			hook, peak := inflight(bound)
			hv := libvirtsim.NewLibvirt(libvirtsim.Options{Options: simcore.Options{Zones: []string{"z"}, Hook: hook}})
			ex := New(Options{Hypervisor: hv, Installation: inst, PerZone: bound, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
			var wg sync.WaitGroup
			errs := make([]error, 4)
			for i := range errs {
				wg.Go(func() {
					name := fmt.Sprintf("vm-%d", i)
					_, errs[i] = ex.Run(context.Background(), planner.Change{Machine: "m-" + name, Steps: libvirtCreate(name)}, "op")
				})
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("run %d: %v", i, err)
				}
			}
			if got := peak(); got != bound {
				t.Errorf("at most %d heavy steps ran at once, want exactly the bound %d", got, bound)
			}
		})
	}
}

// The first terminal failure cancels running steps and starts nothing
// more.
func TestFirstFailureCancelsTheRest(t *testing.T) {
	seedCancelled := make(chan struct{})
	seedIn := make(chan struct{})
	hook := func(ctx context.Context, c simcore.Call) error {
		switch c.Op {
		case "CreateSeed":
			close(seedIn)
			<-ctx.Done()
			close(seedCancelled)
			return ctx.Err()
		case "CreateOverlay":
			<-seedIn
			return fmt.Errorf("base image is gone: %w", hypervisors.ErrNotFound)
		}
		return nil
	}
	hv := libvirtsim.NewLibvirt(libvirtsim.Options{Options: simcore.Options{Zones: []string{"z"}, Hook: hook}})
	_, err := newExec(hv, nil).Run(context.Background(), planner.Change{Machine: "m-vm", Steps: libvirtCreate("vm")}, "op")
	var se *StepError
	if !errors.As(err, &se) || se.Step != "z/vm/create-overlay:disk" || !errors.Is(err, hypervisors.ErrNotFound) {
		t.Fatalf("err = %v, want the overlay step's ErrNotFound", err)
	}
	select {
	case <-seedCancelled:
	default:
		t.Error("the running seed step was not cancelled")
	}
	if n := hv.Calls()["DefineDomain"]; n != 0 {
		t.Errorf("define ran %d times after its dependency failed", n)
	}
}

// A dependency named twice is one edge: counted once towards the step's
// readiness and listed once among its dependants.
func TestGraphDependencyNamedTwice(t *testing.T) {
	tg := hypervisors.Target{Zone: "z", Name: "vm"}
	a := step(planner.ActionStart, tg, planner.Params{})
	b := step(planner.ActionWaitAgent, tg, planner.Params{})
	b.DependsOn = []string{a.ID, a.ID}
	g, err := newGraph([]planner.Step{a, b})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([][]int{nil, {0}}, g.deps); diff != "" {
		t.Errorf("deps (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([][]int{{1}, nil}, g.dependants); diff != "" {
		t.Errorf("dependants (-want +got):\n%s", diff)
	}
}
