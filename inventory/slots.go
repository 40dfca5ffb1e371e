package inventory

import (
	"fmt"
	"maps"
	"sort"
)

// MaxSlots caps the slots one provider offers (the sum of the offerings'
// counts, or --seed-count). Each slot costs about a kilobyte of memory and
// of state; a larger host-set is split across providers.
const MaxSlots = 1_000_000

// Slot is one machine the offerings allow: a Speculative machine until the
// shard actuates it. ID is MachineID(Zone, Type.Name, Index).
type Slot struct {
	ID           string            `json:"id"`
	Zone         string            `json:"zone"`
	Index        int               `json:"index"`
	Type         InstanceType      `json:"type"`
	Capacity     CapacityType      `json:"capacity"`
	Resources    map[string]string `json:"resources,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	PricePerHour float64           `json:"price_per_hour"`
}

// Slots expands validated offerings into their slots, indices 0..Count-1
// per offering, sorted by ID. Each slot owns copies of the offering's
// resources and labels. It fails if an offering names a type missing from
// c or two offerings mint the same id, which Validate already rules out.
func Slots(offs []Offering, c Catalog, p Pricing) ([]Slot, error) {
	n := 0
	for _, o := range offs {
		if o.Count > MaxSlots || n+o.Count > MaxSlots {
			return nil, fmt.Errorf("offerings describe more than %d slots, the cap", MaxSlots)
		}
		n += max(o.Count, 0)
	}
	slots := make([]Slot, 0, n)
	for i, o := range offs {
		it, ok := c[o.InstanceType]
		if !ok {
			return nil, fmt.Errorf("offerings[%d]: instance_type %q is not in the catalog", i, o.InstanceType)
		}
		price := p.Price(it, o.CapacityType)
		for idx := range o.Count {
			slots = append(slots, Slot{
				ID:           MachineID(o.Zone, it.Name, idx),
				Zone:         o.Zone,
				Index:        idx,
				Type:         it,
				Capacity:     o.CapacityType,
				Resources:    maps.Clone(o.Resources),
				Labels:       maps.Clone(o.Labels),
				PricePerHour: price,
			})
		}
	}
	sort.Slice(slots, func(i, j int) bool { return slots[i].ID < slots[j].ID })
	for i := 1; i < len(slots); i++ {
		if slots[i].ID == slots[i-1].ID {
			return nil, fmt.Errorf("two offerings mint machine id %q; merge the offerings for zone %q and type %q", slots[i].ID, slots[i].Zone, slots[i].Type.Name)
		}
	}
	return slots, nil
}
