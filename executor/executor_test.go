package executor

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/libvirtsim"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/proxmoxsim"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvespec"
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
	"github.com/bigfleet-vm/provider/jsonplan"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/planner"
)

const inst = "inst"

func newExec(hv hypervisors.Hypervisor, blob []byte) *Executor {
	return New(Options{Hypervisor: hv, Installation: inst, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		Blob: func(string, string) ([]byte, bool) { return blob, blob != nil }})
}

func step(a planner.Action, t hypervisors.Target, p planner.Params) planner.Step {
	return planner.Step{ID: t.Zone + "/" + t.Name + "/" + string(a), Action: a, Target: t, Params: p}
}

// chain makes each step depend on the one before it, as the planner does.
func chain(steps ...planner.Step) []planner.Step {
	for i := 1; i < len(steps); i++ {
		steps[i].DependsOn = []string{steps[i-1].ID}
	}
	return steps
}

func TestScrub(t *testing.T) {
	blob := []byte("line-one-secret\nshort\nline-three-secret")
	tests := []struct{ in, want string }{
		{"error: line-one-secret is bad", "error: [redacted] is bad"},
		{"short stays", "short stays"},
		{"all: " + string(blob), "all: [redacted]"},
	}
	for _, tc := range tests {
		if got := string(Scrub([]byte(tc.in), blob)); got != tc.want {
			t.Errorf("Scrub(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestDestructiveStepRefusesForeignVM(t *testing.T) {
	hv := libvirtsim.NewLibvirt(libvirtsim.Options{Options: simcore.Options{Zones: []string{"z"}}})
	if err := hv.AddForeignVM("z", "victim", &observed.Marker{Installation: "someone-else", MachineID: "m"}); err != nil {
		t.Fatal(err)
	}
	tg := hypervisors.Target{Zone: "z", Name: "victim"}
	_, err := newExec(hv, nil).Run(context.Background(), planner.Change{Machine: "m", Steps: chain(
		step(planner.ActionStop, tg, planner.Params{}), step(planner.Action(lvspec.ActionUndefine), tg, planner.Params{Plugin: &lvspec.Undefine{}}))}, "op-1")
	if !errors.Is(err, hypervisors.ErrNotOwned) {
		t.Fatalf("err = %v, want ErrNotOwned", err)
	}
	if _, err := hv.Lookup(context.Background(), tg); err != nil {
		t.Fatalf("foreign VM was touched: %v", err)
	}
}

func TestDestructiveStepOnMissingVMSucceeds(t *testing.T) {
	hv := libvirtsim.NewLibvirt(libvirtsim.Options{Options: simcore.Options{Zones: []string{"z"}}})
	tg := hypervisors.Target{Zone: "z", Name: "gone"}
	if _, err := newExec(hv, nil).Run(context.Background(), planner.Change{Machine: "m", Steps: chain(
		step(planner.ActionStop, tg, planner.Params{}), step(planner.Action(lvspec.ActionUndefine), tg, planner.Params{Plugin: &lvspec.Undefine{}}))}, "op"); err != nil {
		t.Fatal(err)
	}
}

// owned creates a running owned VM with a connected agent.
func owned(t *testing.T, hv *libvirtsim.Libvirt, name string) hypervisors.Target {
	t.Helper()
	if err := hv.AddOwnedVM("z", name, observed.Marker{Installation: inst, MachineID: "m"}, observed.PowerRunning); err != nil {
		t.Fatal(err)
	}
	return hypervisors.Target{Zone: "z", Name: name}
}

func TestTransientErrorsAreRetriedTerminalAreNot(t *testing.T) {
	hv := libvirtsim.NewLibvirt(libvirtsim.Options{Options: simcore.Options{Zones: []string{"z"}}})
	tg := owned(t, hv, "vm")
	hv.SetHook(simcore.FailN("AgentPing", 3, hypervisors.ErrTransient))
	if _, err := newExec(hv, nil).Run(context.Background(), planner.Change{Machine: "m",
		Steps: []planner.Step{step(planner.ActionWaitAgent, tg, planner.Params{})}}, "op"); err != nil {
		t.Fatalf("transient errors should be retried: %v", err)
	}
	hv.SetHook(simcore.FailN("AgentPing", 1, hypervisors.ErrPermission))
	calls := hv.Calls()["AgentPing"]
	_, err := newExec(hv, nil).Run(context.Background(), planner.Change{Machine: "m",
		Steps: []planner.Step{step(planner.ActionWaitAgent, tg, planner.Params{})}}, "op")
	if !errors.Is(err, hypervisors.ErrPermission) {
		t.Fatalf("err = %v", err)
	}
	if got := hv.Calls()["AgentPing"] - calls; got > 1 {
		t.Errorf("terminal error retried: %d calls", got)
	}
}

func TestBootstrapDeliversBlobAndRemovesIt(t *testing.T) {
	hv := libvirtsim.NewLibvirt(libvirtsim.Options{Options: simcore.Options{Zones: []string{"z"}, Faults: true}})
	tg := owned(t, hv, "vm")
	blob := []byte("kubeadm join --token abc")
	ex := newExec(hv, blob)
	run := func(cluster, op string) error {
		if err := hv.SetMarker(context.Background(), tg, observed.Marker{Installation: inst, MachineID: "m", Cluster: cluster}); err != nil {
			t.Fatal(err)
		}
		_, err := ex.Run(context.Background(), planner.Change{Machine: "m", Steps: []planner.Step{
			step(planner.ActionExecBootstrap, tg, planner.Params{Exec: []string{libvirt.HookPath, cluster}, BlobPath: libvirt.BlobPath})}}, op)
		return err
	}
	if err := run("c1", "op-1"); err != nil {
		t.Fatal(err)
	}
	bs := hv.Bootstraps(tg)
	if diff := cmp.Diff([]string{"c1", string(blob)}, []string{bs[0].Cluster, string(bs[0].Blob)}); diff != "" {
		t.Errorf("delivered (-want +got):\n%s", diff)
	}
	if _, ok := hv.GuestFile(tg, libvirt.BlobPath); ok {
		t.Error("blob left in the guest")
	}
	err := run("fault-error", "op-2")
	if err == nil || !strings.Contains(err.Error(), "bootstrap hook exited") || strings.Contains(err.Error(), string(blob)) {
		t.Fatalf("failing hook: %v", err)
	}
	// A hook that ran and failed is reported as that, not as an invalid
	// request (issue 12), and it is terminal.
	if strings.Contains(err.Error(), "invalid request") || hypervisors.Retryable(err) {
		t.Errorf("failing hook reported as %q (retryable %v)", err, hypervisors.Retryable(err))
	}
	if _, ok := hv.GuestFile(tg, libvirt.BlobPath); ok {
		t.Error("blob left in the guest after a failing hook")
	}
}

func TestReadinessGateWaitsUntilDeadline(t *testing.T) {
	hv := libvirtsim.NewLibvirt(libvirtsim.Options{Options: simcore.Options{Zones: []string{"z"}, Faults: true}})
	tg := owned(t, hv, "vm")
	if err := hv.SetMarker(context.Background(), tg, observed.Marker{Installation: inst, MachineID: "m", Cluster: "fault-readiness-block"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := newExec(hv, nil).Run(ctx, planner.Change{Machine: "m", Steps: []planner.Step{
		step(planner.ActionExecReady, tg, planner.Params{Exec: []string{simcore.DefaultReadyCommand}})}}, "op")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the deadline", err)
	}
}

// A readiness gate whose deadline passes while a probe runs (the agent
// has not reported its exit yet) fails with the deadline, naming the
// probe cut short: a readiness check is repeatable, so the probe's unknown
// outcome is not the machine's cause (CI saw it so under load, 2026-12-03).
func TestReadinessGateDeadlineDuringProbe(t *testing.T) {
	hv := libvirtsim.NewLibvirt(libvirtsim.Options{Options: simcore.Options{Zones: []string{"z"}, Faults: true}})
	tg := owned(t, hv, "vm")
	if err := hv.SetMarker(context.Background(), tg, observed.Marker{Installation: inst, MachineID: "m", Cluster: "fault-readiness-block"}); err != nil {
		t.Fatal(err)
	}
	// Once the probe is started, every status request waits out the
	// operation: its exit is never reported in time.
	var probing atomic.Bool
	hv.SetHook(func(ctx context.Context, c simcore.Call) error {
		switch {
		case c.Op == simcore.AgentExecOp && slices.ContainsFunc(c.Argv, func(a string) bool { return strings.Contains(a, simcore.DefaultReadyCommand) }):
			probing.Store(true)
		case c.Op == simcore.AgentStatusOp && probing.Load():
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := newExec(hv, nil).Run(ctx, planner.Change{Machine: "m", Steps: []planner.Step{
		step(planner.ActionExecReady, tg, planner.Params{Exec: []string{simcore.DefaultReadyCommand}})}}, "op")
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, hypervisors.ErrOutcomeUnknown) {
		t.Fatalf("err = %v, want the deadline and not an unknown outcome", err)
	}
	if got := ErrorClass(err); got != "deadline" {
		t.Errorf("class %q, want deadline", got)
	}
	if !strings.Contains(err.Error(), simcore.DefaultReadyCommand) {
		t.Errorf("err = %v, want it to name the probe cut short", err)
	}
}

func TestCloneVMIDFlowsToLaterSteps(t *testing.T) {
	hv := proxmoxsim.NewProxmox(proxmoxsim.Options{Options: simcore.Options{Zones: []string{"z"}}})
	mk := observed.Marker{Installation: inst, MachineID: "m"}
	tg := hypervisors.Target{Zone: "z", Name: "vm"}
	out, err := newExec(hv, nil).Run(context.Background(), planner.Change{Machine: "m", Steps: chain(
		step(planner.Action(pvespec.ActionClone), tg, planner.Params{Plugin: &pvespec.CloneSpec{Name: "vm", TemplateVMID: 9000, Marker: mk}}),
		step(planner.Action(pvespec.ActionConfigureVM), tg, planner.Params{Plugin: &pvespec.SizeSpec{VCPU: 4, MemoryMiB: 4096, OnBoot: true, Marker: mk}}),
		step(planner.ActionStart, tg, planner.Params{}),
		step(planner.ActionWaitAgent, tg, planner.Params{}),
	)}, "op")
	if err != nil || out.VMID == 0 {
		t.Fatalf("run: %v %+v", err, out)
	}
	vm, err := hv.Lookup(context.Background(), hypervisors.Target{Zone: "z", VMID: out.VMID})
	if err != nil || vm.VCPU != 4 || vm.Power != observed.PowerRunning {
		t.Fatalf("vm: %v %+v", err, vm)
	}
}

// bare hides everything of the hypervisor it wraps but the common
// interface, as a wrapper that does not forward the steps would.
type bare struct{ hypervisors.Hypervisor }

func (b bare) Unwrap() hypervisors.Hypervisor { return b.Hypervisor }

// A step of the other shape fails with ErrUnsupported (terminal), without
// reaching the hypervisor; a shape's steps are found through wrappers.
func TestStepShape(t *testing.T) {
	mk := observed.Marker{Installation: inst, MachineID: "m"}
	tg := hypervisors.Target{Zone: "z", Name: "bf-vm"}
	clone := step(planner.Action(pvespec.ActionClone), tg, planner.Params{Plugin: &pvespec.CloneSpec{Name: "bf-vm", TemplateVMID: proxmoxsim.DefaultTemplateVMID, Marker: mk}})
	overlay := step(planner.Action(lvspec.ActionCreateOverlay), tg, planner.Params{Plugin: &lvspec.OverlaySpec{Pool: libvirtsim.DefaultPool, Name: "bf-vm-disk.qcow2", BaseImage: libvirtsim.DefaultImage}})
	delVol := step(planner.Action(lvspec.ActionDeleteVolume), tg, planner.Params{Plugin: &lvspec.DeleteVolume{Pool: libvirtsim.DefaultPool, Volume: "bf-vm-disk.qcow2"}})
	opts := simcore.Options{Zones: []string{"z"}}
	tests := []struct {
		name string
		hv   func() (hypervisors.Hypervisor, func() map[string]int)
		step planner.Step
		want error
	}{
		{"clone on libvirt", func() (hypervisors.Hypervisor, func() map[string]int) {
			hv := libvirtsim.NewLibvirt(libvirtsim.Options{Options: opts})
			return hv, hv.Calls
		}, clone, hypervisors.ErrUnsupported},
		{"overlay on proxmox", func() (hypervisors.Hypervisor, func() map[string]int) {
			hv := proxmoxsim.NewProxmox(proxmoxsim.Options{Options: opts})
			return hv, hv.Calls
		}, overlay, hypervisors.ErrUnsupported},
		{"delete volume on proxmox", func() (hypervisors.Hypervisor, func() map[string]int) {
			hv := proxmoxsim.NewProxmox(proxmoxsim.Options{Options: opts})
			return hv, hv.Calls
		}, delVol, hypervisors.ErrUnsupported},
		{"overlay on wrapped libvirt", func() (hypervisors.Hypervisor, func() map[string]int) {
			hv := libvirtsim.NewLibvirt(libvirtsim.Options{Options: opts})
			return bare{hv}, hv.Calls
		}, overlay, nil},
		{"clone on wrapped proxmox", func() (hypervisors.Hypervisor, func() map[string]int) {
			hv := proxmoxsim.NewProxmox(proxmoxsim.Options{Options: opts})
			return bare{hv}, hv.Calls
		}, clone, nil},
		{"clone on wrapped libvirt", func() (hypervisors.Hypervisor, func() map[string]int) {
			hv := libvirtsim.NewLibvirt(libvirtsim.Options{Options: opts})
			return bare{hv}, hv.Calls
		}, clone, hypervisors.ErrUnsupported},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hv, calls := tc.hv()
			defer hv.Close()
			_, err := newExec(hv, nil).Run(context.Background(), planner.Change{Machine: "m", Steps: []planner.Step{tc.step}}, "op")
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if tc.want == nil {
				return
			}
			if !strings.Contains(err.Error(), string(tc.step.Action)+" on ") {
				t.Errorf("err = %v, want it to name the step and the hypervisor", err)
			}
			if d := cmp.Diff(map[string]int{}, calls()); d != "" {
				t.Errorf("calls (-want +got):\n%s", d)
			}
		})
	}
}

// namedLikeBind is a plug-in step whose name is a core action's: the
// executor must hand it to Apply, never run the core's bind with it.
type namedLikeBind struct{}

func (namedLikeBind) Info() hypervisors.ActionInfo {
	return hypervisors.ActionInfo{Name: "bind", Effect: hypervisors.EffectChange, Heavy: true, Op: "x"}
}
func (namedLikeBind) PlanJSON(*jsonplan.Params) {}

// TestPluginStepsGoToApply: a step carrying plug-in params is the
// plug-in's whatever its name (here "bind": the core's bind would
// dereference a nil marker), and a step of an action nobody defines is
// refused before anything is looked up.
func TestPluginStepsGoToApply(t *testing.T) {
	hv := libvirtsim.NewLibvirt(libvirtsim.Options{Options: simcore.Options{Zones: []string{"z"}}})
	defer hv.Close()
	tg := hypervisors.Target{Zone: "z", Name: "bf-vm"}
	_, err := newExec(hv, nil).Run(context.Background(), planner.Change{Machine: "m", Steps: []planner.Step{
		{ID: "z/bf-vm/bind", Action: "bind", Target: tg, Params: planner.Params{Plugin: namedLikeBind{}}}}}, "op")
	if !errors.Is(err, hypervisors.ErrUnsupported) {
		t.Errorf("a plug-in step named bind: %v, want the adapter's ErrUnsupported from Apply", err)
	}
	_, err = newExec(hv, nil).Run(context.Background(), planner.Change{Machine: "m", Steps: []planner.Step{
		{ID: "z/bf-vm/teleport", Action: "teleport", Target: tg}}}, "op")
	if !errors.Is(err, hypervisors.ErrInvalid) {
		t.Errorf("a step of an unknown action without params: %v, want ErrInvalid", err)
	}
	if n := hv.Calls()["Lookup"]; n != 0 {
		t.Errorf("%d lookups for steps that cannot run, want 0", n)
	}
}
