package inventory

import (
	"fmt"
	"strings"

	"github.com/bigfleet-vm/provider/hypervisors"
)

// CapacityType is how a slot's capacity behaves. The closed set is
// OnDemand (a churning pool: Delete destroys the VM) and BareMetal (a fixed
// free pool priced at zero that is never deleted; libvirt only).
type CapacityType string

const (
	OnDemand  CapacityType = "on_demand"
	BareMetal CapacityType = "bare_metal"
)

// ParseCapacityType maps a capacity_type spelling (case-insensitive,
// surrounding space ignored) to its canonical value for a hypervisor
// shape. on_demand, on-demand, ondemand and "" are OnDemand; on libvirt
// bare_metal, bare-metal and metal are BareMetal. Everything else is an
// error that says why the type cannot be offered.
func ParseCapacityType(s string, shape hypervisors.Shape) (CapacityType, error) {
	where := "a libvirt host"
	if shape == hypervisors.ShapeProxmox {
		where = "a self-hosted Proxmox cluster"
	}
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "on_demand", "on-demand", "ondemand":
		return OnDemand, nil
	case "bare_metal", "bare-metal", "metal":
		if shape == hypervisors.ShapeProxmox {
			return "", fmt.Errorf("capacity_type %q is not supported on Proxmox: its VMs are deletable clones, not a fixed free pool; use on_demand", s)
		}
		return BareMetal, nil
	case "spot":
		return "", fmt.Errorf("capacity_type %q is not supported: %s has no preemption market; use on_demand", s, where)
	case "reserved":
		return "", fmt.Errorf("capacity_type %q is not supported: %s has no reservation or commitment billing; use on_demand", s, where)
	}
	if shape == hypervisors.ShapeProxmox {
		return "", fmt.Errorf("unknown capacity_type %q; use on_demand", s)
	}
	return "", fmt.Errorf("unknown capacity_type %q; use on_demand or bare_metal", s)
}
