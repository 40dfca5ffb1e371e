package inventory

import (
	"fmt"
	"sort"
)

// Caps on what the configuration files may say (docs/operations.md lists
// them with the file caps). They keep every number the provider derives
// from them (allocatable, prices, state size) finite and every string it
// repeats in machines, logs and metrics short.
const (
	// MaxVCPU caps an instance type's vCPU count (QEMU's own limit for a
	// KVM guest is of this order).
	MaxVCPU = 1024
	// MaxMemoryMiB caps an instance type's memory: 16 TiB.
	MaxMemoryMiB = 16 << 20
	// MaxMapEntries caps the entries of an offering's resources and of its
	// labels; every slot of the offering carries a copy.
	MaxMapEntries = 64
	// MaxKeyBytes and MaxValueBytes cap one key and one value of those
	// maps.
	MaxKeyBytes   = 256
	MaxValueBytes = 1024
	// MaxPricePerHour caps an explicit price and a synthetic rate, in USD
	// per hour.
	MaxPricePerHour = 1_000_000
)

// CheckVCPU reports why n cannot be an instance type's vCPU count.
func CheckVCPU(n int) error {
	switch {
	case n <= 0:
		return fmt.Errorf("vcpu must be positive, got %d", n)
	case n > MaxVCPU:
		return fmt.Errorf("vcpu %d is above the cap of %d", n, MaxVCPU)
	}
	return nil
}

// CheckMemoryMiB reports why n cannot be an instance type's memory in
// MiB.
func CheckMemoryMiB(n int) error {
	switch {
	case n <= 0:
		return fmt.Errorf("memory_mib must be positive, got %d", n)
	case n > MaxMemoryMiB:
		return fmt.Errorf("memory_mib %d is above the cap of %d (16 TiB)", n, MaxMemoryMiB)
	}
	return nil
}

// checkStringMap reports every way m breaks the caps of an offering's
// resources or labels, in key order.
func checkStringMap(what string, m map[string]string) []error {
	var errs []error
	if len(m) > MaxMapEntries {
		errs = append(errs, fmt.Errorf("%s has %d entries; the cap is %d", what, len(m), MaxMapEntries))
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if len(k) > MaxKeyBytes {
			errs = append(errs, fmt.Errorf("%s key %.32q... is %d bytes; the cap is %d", what, k, len(k), MaxKeyBytes))
		}
		if v := m[k]; len(v) > MaxValueBytes {
			errs = append(errs, fmt.Errorf("%s[%.32q] is %d bytes; the cap is %d", what, k, len(v), MaxValueBytes))
		}
	}
	return errs
}
