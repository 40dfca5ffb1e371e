package inventory

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"

	"github.com/bigfleet-vm/provider/conffile"
	"github.com/hashicorp/go-multierror"
)

// Offering is one shape of capacity the provider may provision: up to
// Count slots of InstanceType in Zone. After validation CapacityType is
// canonical and (Zone, InstanceType) is unique among the offerings.
type Offering struct {
	InstanceType string            `json:"instance_type"`
	Zone         string            `json:"zone"`
	CapacityType CapacityType      `json:"capacity_type"`
	Count        int               `json:"count"`
	Resources    map[string]string `json:"resources,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
}

// Rules is what offerings are validated against.
type Rules struct {
	// Capacity are the hypervisor's capacity types.
	Capacity CapacityRules
	Catalog  Catalog
	// Zones, when non-nil, is the closed set of zones an offering may name
	// (a real backend's --connect zones or --nodes). Nil admits any valid
	// zone name (the fake backend).
	Zones []string
	// ZoneFlag names the flag Zones came from, for messages ("--connect").
	ZoneFlag string
}

// offeringJSON is the strict JSON form; pointers tell omitted from zero.
type offeringJSON struct {
	InstanceType *string           `json:"instance_type"`
	Zone         *string           `json:"zone"`
	CapacityType *string           `json:"capacity_type"`
	Count        *int              `json:"count"`
	Resources    map[string]string `json:"resources"`
	Labels       map[string]string `json:"labels"`
}

// LoadOfferings reads and parses an offerings file (see ParseOfferings):
// a regular file of at most conffile.MaxJSONBytes. Every problem is
// reported on its own, led by the file's path.
func LoadOfferings(path string, r Rules) ([]Offering, error) {
	data, err := conffile.Read(path, conffile.MaxJSONBytes)
	if err != nil {
		return nil, fmt.Errorf("read offerings: %w", err)
	}
	offs, err := ParseOfferings(data, r)
	if err != nil {
		return nil, inFile(path, err)
	}
	return offs, nil
}

// ParseOfferings decodes a JSON array of offerings strictly (unknown keys,
// a key given twice in one object, wrongly typed values, trailing data and
// an empty array are errors) and validates the result with Validate.
// Every problem found is reported, each naming the offering by its
// position or the line.
func ParseOfferings(data []byte, r Rules) ([]Offering, error) {
	var errs *multierror.Error
	for _, err := range duplicateKeys(data) {
		errs = multierror.Append(errs, err)
	}
	var raws []json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&raws); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, errors.New("must be a JSON array of offering objects")
		}
		return nil, notJSON(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the offerings array; the file must hold exactly one JSON array")
	}
	if len(raws) == 0 {
		return nil, errors.New("holds no offerings; add at least one or omit --offerings to use the default mix")
	}
	offs := make([]Offering, 0, len(raws))
	pos := make([]int, 0, len(raws))
	for i, raw := range raws {
		var o offeringJSON
		d := json.NewDecoder(bytes.NewReader(raw))
		d.DisallowUnknownFields()
		if err := d.Decode(&o); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("offerings[%d]: %s (allowed keys: instance_type, zone, capacity_type, count, resources, labels)", i, jsonError(err)))
			continue
		}
		var missing []string
		if o.InstanceType == nil {
			missing = append(missing, "instance_type")
		}
		if o.Zone == nil {
			missing = append(missing, "zone")
		}
		if o.Count == nil {
			missing = append(missing, "count")
		}
		if len(missing) > 0 {
			errs = multierror.Append(errs, fmt.Errorf("offerings[%d]: missing required key(s) %s", i, strings.Join(missing, ", ")))
			continue
		}
		off := Offering{InstanceType: *o.InstanceType, Zone: *o.Zone, Count: *o.Count, Resources: o.Resources, Labels: o.Labels}
		if o.CapacityType != nil {
			off.CapacityType = CapacityType(*o.CapacityType)
		}
		offs = append(offs, off)
		pos = append(pos, i)
	}
	// Validate what decoded even when something did not, so one run
	// reports every problem; positions stay those of the file.
	valid, err := validate(offs, pos, r)
	if err != nil {
		errs = multierror.Append(errs, err)
	}
	if err := finish(errs); err != nil {
		return nil, err
	}
	return valid, nil
}

// Validate checks offerings against r and returns them with canonical
// capacity types. It rejects: an empty list; an empty, invalid or
// unconfigured zone; an instance type missing from the catalog; a capacity
// type the hypervisor cannot offer; a count below one; empty resource or label
// keys; two offerings for the same (zone, instance_type), which would mint
// colliding machine ids; and a mix of on_demand and bare_metal.
// Every problem found is reported.
func Validate(offs []Offering, r Rules) ([]Offering, error) {
	if len(offs) == 0 {
		return nil, errors.New("no offerings: add at least one")
	}
	pos := make([]int, len(offs))
	for i := range pos {
		pos[i] = i
	}
	return validate(offs, pos, r)
}

// validate is Validate with pos[i] naming offs[i] in messages.
func validate(offs []Offering, pos []int, r Rules) ([]Offering, error) {
	var errs *multierror.Error
	out := make([]Offering, len(offs))
	first := map[[2]string]int{}
	byCapacity := map[CapacityType]int{}
	total := 0 // each count is at most MaxSlots, so this cannot overflow
	for i, o := range offs {
		what := fmt.Sprintf("offerings[%d]", pos[i])
		add := func(err error) { errs = multierror.Append(errs, fmt.Errorf("%s: %w", what, err)) }
		if err := ValidateZone(o.Zone); err != nil {
			add(err)
		} else if r.Zones != nil && !slices.Contains(r.Zones, o.Zone) {
			add(fmt.Errorf("zone %q is not one of the configured zones (%s: %s); add it there or place the offering on a configured zone",
				o.Zone, flagOr(r.ZoneFlag), strings.Join(r.Zones, ", ")))
		}
		if o.InstanceType == "" {
			add(errors.New("instance_type is empty; name a catalog type"))
		} else if _, ok := r.Catalog[o.InstanceType]; !ok {
			add(fmt.Errorf("instance_type %q is not in the instance-type catalog (known: %s)", o.InstanceType, strings.Join(r.Catalog.Names(), ", ")))
		}
		ct, err := ParseCapacityType(string(o.CapacityType), r.Capacity)
		if err != nil {
			add(err)
		} else {
			byCapacity[ct]++
		}
		switch {
		case o.Count <= 0:
			add(fmt.Errorf("count must be positive, got %d", o.Count))
		case o.Count > MaxSlots:
			add(fmt.Errorf("count %d exceeds the cap of %d slots per provider", o.Count, MaxSlots))
		default:
			total += o.Count
		}
		for _, m := range []struct {
			key string
			m   map[string]string
		}{{"resources", o.Resources}, {"labels", o.Labels}} {
			if _, ok := m.m[""]; ok {
				add(fmt.Errorf("%s has an empty key", m.key))
			}
			for _, err := range checkStringMap(m.key, m.m) {
				add(err)
			}
		}
		key := [2]string{o.Zone, o.InstanceType}
		if j, dup := first[key]; dup {
			add(fmt.Errorf("duplicates offerings[%d] (zone %q, instance_type %q): both would mint the same machine ids; merge them into one offering with the summed count", j, o.Zone, o.InstanceType))
		} else {
			first[key] = pos[i]
		}
		o.CapacityType = ct
		out[i] = o
	}
	if total > MaxSlots {
		errs = multierror.Append(errs, fmt.Errorf("offerings describe %d slots in all; the cap is %d per provider (each slot costs memory and state); split the host-set across providers", total, MaxSlots))
	}
	if byCapacity[OnDemand] > 0 && byCapacity[BareMetal] > 0 {
		errs = multierror.Append(errs, fmt.Errorf("offerings mix on_demand (%d) and bare_metal (%d) capacity: a bare-metal pool is never deleted while an on-demand one is, so run one instance per capacity class", byCapacity[OnDemand], byCapacity[BareMetal]))
	}
	if err := finish(errs); err != nil {
		return nil, err
	}
	return out, nil
}

func flagOr(f string) string {
	if f == "" {
		return "configured zones"
	}
	return f
}

// DefaultResources is the per-replica request shape of default offerings.
func DefaultResources() map[string]string {
	return map[string]string{"cpu": "1", "memory": "2Gi"}
}

// DefaultOfferings synthesises the dev/conformance mix used when no
// offerings file is given. It takes two types, prefix+"small" and
// prefix+"large" (the hypervisor's CatalogRules.Prefix; or, if the catalog lacks either, its smallest and
// largest by vCPU then name), and the first two zones, and spreads
// seedCount slots evenly over the four buckets (small, zone0), (large,
// zone0), (small, zone1), (large, zone1), the remainder going to the
// earliest. Buckets that land on the same (zone, type) — one zone given, or
// a one-type catalog — are merged, never duplicated. Every offering gets
// DefaultResources and the given capacity.
func DefaultOfferings(prefix string, r CapacityRules, c Catalog, zones []string, seedCount int, capacity CapacityType) ([]Offering, error) {
	if seedCount <= 0 {
		return nil, fmt.Errorf("seed count must be positive, got %d", seedCount)
	}
	if seedCount > MaxSlots {
		return nil, fmt.Errorf("seed count %d exceeds the cap of %d slots per provider", seedCount, MaxSlots)
	}
	if len(c) == 0 {
		return nil, errors.New("the instance-type catalog is empty")
	}
	if len(zones) == 0 {
		return nil, errors.New("no zones to place the default offerings on")
	}
	small, large := prefix+"small", prefix+"large"
	_, okS := c[small]
	_, okL := c[large]
	if !okS || !okL {
		bySize := c.BySize()
		small, large = bySize[0].Name, bySize[len(bySize)-1].Name
	}
	zs := zones
	if len(zs) > 2 {
		zs = zs[:2]
	}
	if len(zs) == 1 {
		zs = []string{zs[0], zs[0]}
	}
	type bucket struct{ zone, typ string }
	buckets := []bucket{{zs[0], small}, {zs[0], large}, {zs[1], small}, {zs[1], large}}
	counts := map[bucket]int{}
	var order []bucket
	for i, b := range buckets {
		n := seedCount / len(buckets)
		if i < seedCount%len(buckets) {
			n++
		}
		if n == 0 {
			continue
		}
		if _, seen := counts[b]; !seen {
			order = append(order, b)
		}
		counts[b] += n
	}
	offs := make([]Offering, 0, len(order))
	for _, b := range order {
		offs = append(offs, Offering{InstanceType: b.typ, Zone: b.zone, CapacityType: capacity, Count: counts[b], Resources: DefaultResources()})
	}
	return Validate(offs, Rules{Capacity: r, Catalog: c})
}

// CreateFaultLabel is the BigFleet conformance fault convention's
// offering label: with the value "error" a simulator fails the Create of
// the offering's slots.
const CreateFaultLabel = "conformance.fault/create"

// FaultOfferings is what the simulator adds to the default offerings in
// conformance fault mode: three slots on the first zone labelled
// CreateFaultLabel=error, of a catalog type the default mix leaves unused
// on that zone (so their machine ids never collide with it), or nil if the
// catalog has no such type.
func FaultOfferings(c Catalog, defaults []Offering, capacity CapacityType) []Offering {
	if len(defaults) == 0 {
		return nil
	}
	zone := defaults[0].Zone
	used := map[string]bool{}
	for _, o := range defaults {
		if o.Zone == zone {
			used[o.InstanceType] = true
		}
	}
	for _, it := range c.BySize() {
		if !used[it.Name] {
			return []Offering{{InstanceType: it.Name, Zone: zone, CapacityType: capacity, Count: 3,
				Resources: DefaultResources(), Labels: map[string]string{CreateFaultLabel: "error"}}}
		}
	}
	return nil
}

// Zones returns the distinct zones of offs in byte-wise order.
func Zones(offs []Offering) []string {
	set := map[string]bool{}
	for _, o := range offs {
		set[o.Zone] = true
	}
	zones := make([]string, 0, len(set))
	for z := range set {
		zones = append(zones, z)
	}
	sort.Strings(zones)
	return zones
}
