package fake

import (
	"fmt"

	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvespec"
	"github.com/bigfleet-vm/provider/inventory"
	"github.com/bigfleet-vm/provider/observed"
)

// The out-of-band changes take what the admin endpoints pass from any
// HTTP client, so they check it with the rules the wire applies to the
// same values (desired's id rules, the inventory's size caps) before
// anything changes; a refusal wraps hypervisors.ErrInvalid. A value the
// provider could never have sent would otherwise sit in the world for
// good: an id over the cap is never adopted (a permanent "adopt" in every
// plan), and a name that is not UTF-8 fails every List answer.

func invalid(err error) error { return fmt.Errorf("%w: %v", hypervisors.ErrInvalid, err) }

// checkVMName checks a VM name: non-empty UTF-8 of at most
// desired.MaxIDBytes, the rule of every id on the wire.
func checkVMName(name string) error {
	if err := desired.CheckID("name", name); err != nil {
		return invalid(err)
	}
	return nil
}

// checkMarker checks an ownership marker's ids and instance type.
func checkMarker(m *observed.Marker) error {
	if m == nil {
		return nil
	}
	for _, f := range []struct{ field, v string }{{"installation", m.Installation}, {"machine id", m.MachineID}} {
		if err := desired.CheckID(f.field, f.v); err != nil {
			return invalid(err)
		}
	}
	if m.Cluster != "" {
		if err := desired.CheckID("cluster", m.Cluster); err != nil {
			return invalid(err)
		}
	}
	if m.InstanceType != "" {
		if err := inventory.ValidateTypeName(m.InstanceType); err != nil {
			return invalid(err)
		}
	}
	return nil
}

// checkSize checks a vCPU count and memory size against the catalog's
// caps.
func checkSize(vcpu, memoryMiB int) error {
	if err := inventory.CheckVCPU(vcpu); err != nil {
		return invalid(err)
	}
	if err := inventory.CheckMemoryMiB(memoryMiB); err != nil {
		return invalid(err)
	}
	return nil
}

// checkVMID checks a Proxmox VMID; 0 asks the simulator to allocate one.
func checkVMID(vmid int) error {
	if vmid != 0 && (vmid < pvespec.MinVMID || vmid > pvespec.MaxVMID) {
		return invalid(fmt.Errorf("vmid %d is outside the Proxmox VMID range %d..%d", vmid, pvespec.MinVMID, pvespec.MaxVMID))
	}
	return nil
}
