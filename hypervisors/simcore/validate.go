package simcore

import (
	"fmt"

	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/hypervisors"
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

// Invalid wraps a refused value in hypervisors.ErrInvalid.
func Invalid(err error) error { return fmt.Errorf("%w: %v", hypervisors.ErrInvalid, err) }

// CheckVMName checks a VM name: non-empty UTF-8 of at most
// desired.MaxIDBytes, the rule of every id on the wire.
func CheckVMName(name string) error {
	if err := desired.CheckID("name", name); err != nil {
		return Invalid(err)
	}
	return nil
}

// CheckMarker checks an ownership marker's ids and instance type.
func CheckMarker(m *observed.Marker) error {
	if m == nil {
		return nil
	}
	for _, f := range []struct{ field, v string }{{"installation", m.Installation}, {"machine id", m.MachineID}} {
		if err := desired.CheckID(f.field, f.v); err != nil {
			return Invalid(err)
		}
	}
	if m.Cluster != "" {
		if err := desired.CheckID("cluster", m.Cluster); err != nil {
			return Invalid(err)
		}
	}
	if m.InstanceType != "" {
		if err := inventory.ValidateTypeName(m.InstanceType); err != nil {
			return Invalid(err)
		}
	}
	return nil
}

// CheckSize checks a vCPU count and memory size against the catalog's
// caps.
func CheckSize(vcpu, memoryMiB int) error {
	if err := inventory.CheckVCPU(vcpu); err != nil {
		return Invalid(err)
	}
	if err := inventory.CheckMemoryMiB(memoryMiB); err != nil {
		return Invalid(err)
	}
	return nil
}
