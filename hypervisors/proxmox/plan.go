package proxmox

import (
	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvespec"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/planner"
)

// PlanSettings are the Proxmox settings plans are built from.
type PlanSettings struct {
	// Pool is the Proxmox resource pool clones join ("" none).
	Pool string
	// BootstrapPath is where the blob goes in the guest; BootstrapExec the
	// hook run with it as its last argument.
	BootstrapPath string
	BootstrapExec []string
}

// Planner is the Proxmox plug-in's planning half: a VM is a full clone of
// the instance type's template, sized after cloning, found by the VMID
// the clone allocated.
func Planner(s PlanSettings) planner.Plugin { return &plan{s} }

type plan struct{ s PlanSettings }

func (*plan) Name() string { return "proxmox" }

func (*plan) Actions() []hypervisors.ActionInfo { return pvespec.Actions }

func (*plan) Observation() planner.Observation { return planner.Observation{Identity: planner.ByID} }

func (*plan) DriftKinds() []planner.DriftKind { return nil }

func (p *plan) Create(b *planner.Builder, vm *observed.VM) {
	m := b.Machine()
	mk := b.Marker("")
	size := &pvespec.SizeSpec{VCPU: m.VCPU, MemoryMiB: m.MemoryMiB, OnBoot: true, Marker: mk}
	if vm != nil {
		// A clone adopted after a crash may not have been sized yet.
		if !sized(vm, size) {
			b.AddOn(vm, "", size, "adopt:resize")
		}
		b.EnsureRunning(vm, "intent:create")
		return
	}
	t := hypervisors.Target{Zone: m.Zone, Name: m.VMName}
	b.Add(t, "", &pvespec.CloneSpec{Name: m.VMName, TemplateVMID: m.Source, Pool: p.s.Pool, Marker: mk, Labels: m.Labels}, "missing")
	b.Add(t, "", size, "intent:create")
	b.Start(t, "intent:create")
}

// sized reports whether an observed clone already has the size and the
// marker of this Create. The adapters report a marker only for a VM that
// carries this installation's ownership tags (TestObserveMarkerNeedsOwnershipTags).
func sized(vm *observed.VM, s *pvespec.SizeSpec) bool {
	if vm.VCPU != s.VCPU || vm.MemoryMiB != s.MemoryMiB || vm.Autostart != s.OnBoot {
		return false
	}
	return vm.Marker != nil && vm.Marker.OpID == s.Marker.OpID
}

func (*plan) Destroy(b *planner.Builder, vm *observed.VM, reason string, _ bool) {
	if vm != nil {
		b.AddOn(vm, "", &pvespec.DeleteVM{}, reason)
	}
}

func (p *plan) Bootstrap(*desired.Machine) ([]string, string) {
	return append(append([]string(nil), p.s.BootstrapExec...), p.s.BootstrapPath), p.s.BootstrapPath
}

func (*plan) Volumes(*desired.Machine) (string, []string) { return "", nil }
