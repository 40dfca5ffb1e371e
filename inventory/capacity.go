package inventory

import (
	"fmt"
	"strings"
)

// CapacityType is how a slot's capacity behaves. The closed set is
// OnDemand (a churning pool: Delete destroys the VM) and BareMetal (a fixed
// free pool priced at zero that is never deleted; where the hypervisor
// offers it, CapacityRules.BareMetal).
type CapacityType string

const (
	OnDemand  CapacityType = "on_demand"
	BareMetal CapacityType = "bare_metal"
)

// CapacityRules is what a hypervisor says about the capacity types it
// offers.
type CapacityRules struct {
	// Where names the hypervisor in a refusal: "a libvirt host".
	Where string
	// BareMetal is true when bare_metal can be offered; RefuseBareMetal,
	// when it cannot, says why (given the spelling used).
	BareMetal       bool
	RefuseBareMetal func(spelling string) error
}

// ParseCapacityType maps a capacity_type spelling (case-insensitive,
// surrounding space ignored) to its canonical value under a hypervisor's
// rules. on_demand, on-demand, ondemand and "" are OnDemand; where
// r.BareMetal, bare_metal, bare-metal and metal are BareMetal. Everything
// else is an error that says why the type cannot be offered.
func ParseCapacityType(s string, r CapacityRules) (CapacityType, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "on_demand", "on-demand", "ondemand":
		return OnDemand, nil
	case "bare_metal", "bare-metal", "metal":
		if !r.BareMetal {
			if r.RefuseBareMetal != nil {
				return "", r.RefuseBareMetal(s)
			}
			return "", fmt.Errorf("capacity_type %q is not supported on %s; use on_demand", s, r.Where)
		}
		return BareMetal, nil
	case "spot":
		return "", fmt.Errorf("capacity_type %q is not supported: %s has no preemption market; use on_demand", s, r.Where)
	case "reserved":
		return "", fmt.Errorf("capacity_type %q is not supported: %s has no reservation or commitment billing; use on_demand", s, r.Where)
	}
	if !r.BareMetal {
		return "", fmt.Errorf("unknown capacity_type %q; use on_demand", s)
	}
	return "", fmt.Errorf("unknown capacity_type %q; use on_demand or bare_metal", s)
}
