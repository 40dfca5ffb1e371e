package inventory

import (
	"errors"
	"fmt"
)

// testShape stands for the rules the two shipped hypervisors give (their
// plug-ins' CatalogRules and CapacityRules, whose wording config's tests
// check through the plug-ins): inventory's own tests must not import a
// hypervisor.
type testShape string

const (
	lv testShape = "libvirt"
	px testShape = "proxmox"
)

func (s testShape) prefix() string {
	if s == px {
		return "pve."
	}
	return "kvm."
}

func (s testShape) catalog(templateVMID int) CatalogRules {
	if s == px {
		return CatalogRules{Prefix: "pve.", DefaultSource: templateVMID, Keys: "vcpu, memory_mib, template_vmid",
			Source: func(v *int) (int, error) {
				if v == nil || *v == 0 {
					return templateVMID, nil
				}
				if *v < 100 || *v > 999999999 {
					return *v, fmt.Errorf("template_vmid: template VMID %d is outside the Proxmox VMID range %d..%d", *v, 100, 999999999)
				}
				return *v, nil
			}}
	}
	return CatalogRules{Prefix: "kvm.", Keys: "vcpu, memory_mib", Source: func(v *int) (int, error) {
		if v != nil {
			return 0, errors.New("template_vmid is a Proxmox setting; libvirt types boot from --image, remove the key")
		}
		return 0, nil
	}}
}

func (s testShape) capacity() CapacityRules {
	if s == px {
		return CapacityRules{Where: "a self-hosted Proxmox cluster", RefuseBareMetal: func(spelling string) error {
			return fmt.Errorf("capacity_type %q is not supported on Proxmox: its VMs are deletable clones, not a fixed free pool; use on_demand", spelling)
		}}
	}
	return CapacityRules{Where: "a libvirt host", BareMetal: true}
}
