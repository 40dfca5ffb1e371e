package inventory

import (
	"testing"
)

// The parsers of operator files never panic, never hang on huge counts,
// and whatever they accept describes at most MaxSlots slots that Slots can
// expand.
func FuzzOfferings(f *testing.F) {
	f.Add([]byte(`[{"instance_type":"kvm.small","zone":"local-a","count":3}]`))
	f.Add([]byte(`[{"instance_type":"kvm.small","zone":"local-a","count":9223372036854775807}]`))
	f.Add([]byte(`[{"instance_type":"kvm.small","zone":"a","count":1000000},{"instance_type":"kvm.large","zone":"a","count":1}]`))
	f.Add([]byte(`[{"instance_type":"kvm.small","zone":"a","count":2,"labels":{"":"x"},"resources":{"cpu":"1"}}]`))
	f.Add([]byte(`{}`))
	c := Builtin(lv.catalog(0))
	f.Fuzz(func(t *testing.T, data []byte) {
		offs, err := ParseOfferings(data, Rules{Capacity: lv.capacity(), Catalog: c})
		if err != nil {
			return
		}
		total := 0
		for _, o := range offs {
			total += o.Count
		}
		if total > MaxSlots {
			t.Fatalf("accepted %d slots, above the cap", total)
		}
		if total > 10000 {
			return // expanding a million slots per input would starve the fuzzer
		}
		p, _ := NewPricing(0.003, 0.0008, nil)
		if _, err := Slots(offs, c, p); err != nil {
			t.Fatalf("accepted offerings do not expand: %v", err)
		}
	})
}

func FuzzCatalog(f *testing.F) {
	f.Add([]byte(`{"kvm.tiny":{"vcpu":1,"memory_mib":512}}`))
	f.Add([]byte(`{"pve.x":{"vcpu":9223372036854775807,"memory_mib":-1,"template_vmid":100}}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, shape := range []testShape{lv, px} {
			c, err := ParseCatalog(data, shape.catalog(9000))
			if err != nil {
				continue
			}
			for name, it := range c {
				if it.VCPU <= 0 || it.MemoryMiB <= 0 {
					t.Fatalf("accepted %s with %d vCPU and %d MiB", name, it.VCPU, it.MemoryMiB)
				}
				Allocatable(it)
			}
		}
	})
}

func FuzzPrices(f *testing.F) {
	f.Add("kvm.small=0.05,kvm.large=1")
	f.Add("kvm.small=NaN")
	f.Add("=,=,kvm.small=-1e400")
	c := Builtin(lv.catalog(0))
	f.Fuzz(func(t *testing.T, s string) {
		prices, err := ParsePrices(s, c)
		if err != nil {
			return
		}
		p, err := NewPricing(0.003, 0.0008, prices)
		if err != nil {
			return
		}
		for _, it := range c {
			if v := p.Price(it, OnDemand); !(v >= 0) || v > 1e300 {
				t.Fatalf("price %v for %s from %q", v, it.Name, s)
			}
		}
	})
}
