package desired

import (
	"sort"
	"time"
)

// View is a read-only reading of a stored document, what `provider plan`
// plans from without a running server: the machines exactly as stored
// (intents untouched, so the plan shows what the running server would do
// next), plus SPECULATIVE machines for slots the offerings add.
type View struct {
	Installation string
	Lineage      string
	// Serial is the stored document's newest revision.
	Serial uint64
	// Fresh is true when nothing was stored: a new installation.
	Fresh    bool
	Machines []*Machine // sorted by id
}

// Inspect reads a stored document (for example statefile.ReadOnly's
// result) without opening it for writing. It applies the same checks Open
// does (format, installation id, offerings that move a known id) and
// changes nothing.
func Inspect(stored map[string][]byte, opts Options, slots []Slot) (*View, error) {
	ld, err := decode(stored, opts, nil)
	if err != nil {
		return nil, err
	}
	if err := checkSlots(ld.index(0), slots); err != nil {
		return nil, err
	}
	now := time.Now()
	if opts.Now != nil {
		now = opts.Now()
	}
	v := &View{Installation: ld.meta.Installation, Lineage: ld.meta.Lineage, Serial: ld.meta.Rev, Fresh: ld.fresh,
		Machines: make([]*Machine, 0, max(len(ld.machines), len(slots)))}
	known := make(map[string]bool, len(ld.machines))
	for _, m := range ld.machines {
		known[m.ID] = true
		v.Machines = append(v.Machines, m)
	}
	for _, s := range slots {
		if !known[s.ID] {
			v.Machines = append(v.Machines, &Machine{ID: s.ID, Zone: s.Zone, InstanceType: s.InstanceType, Capacity: s.Capacity,
				VCPU: s.VCPU, MemoryMiB: s.MemoryMiB, Source: s.Source, Price: s.Price,
				Resources: s.Resources, Labels: s.Labels, State: Speculative, Since: now,
				Ops: map[Kind]OpRecord{}, memo: &memo{}})
		}
	}
	sort.Slice(v.Machines, func(i, j int) bool { return v.Machines[i].ID < v.Machines[j].ID })
	return v, nil
}
