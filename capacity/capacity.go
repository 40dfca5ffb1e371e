package capacity

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
)

// Resources compared. Disk is reported (the host's pool or storage) but
// not compared: the catalog's instance types carry no disk size.
const (
	CPU    = "cpu"    // vCPUs against the host's CPUs
	Memory = "memory" // bytes
	Disk   = "disk"   // bytes of the zone's pool or storage (capacity only)
)

// Resources are the compared resources, in report order.
var Resources = []string{CPU, Memory}

// Slot is one machine of the desired document as capacity sees it.
type Slot struct {
	Zone         string
	InstanceType string
	Running      bool // not SPECULATIVE: it holds host resources now
}

// TypeSpec sizes an instance type (the catalog); ok false for an unknown
// type, which is left out of the sums.
type TypeSpec func(instanceType string) (vcpu, memoryMiB int, ok bool)

// Usage is an amount of every compared resource.
type Usage struct {
	VCPU        int    `json:"vcpu"`
	MemoryBytes uint64 `json:"memory_bytes"`
}

// Zone is one zone's comparison.
type Zone struct {
	Zone    string                   `json:"zone"`
	Host    hypervisors.HostCapacity `json:"host"`
	Offered Usage                    `json:"offered"` // every slot: what the offerings can place
	Running Usage                    `json:"running"` // the slots not SPECULATIVE
}

// Ratio is offered over the host's capacity for resource (CPU or
// Memory); 0 when the host's figure is unknown.
func (z Zone) Ratio(resource string) float64 {
	switch resource {
	case CPU:
		if z.Host.CPUs > 0 {
			return float64(z.Offered.VCPU) / float64(z.Host.CPUs)
		}
	case Memory:
		if z.Host.MemoryBytes > 0 {
			return float64(z.Offered.MemoryBytes) / float64(z.Host.MemoryBytes)
		}
	}
	return 0
}

// Over lists the resources whose ratio exceeds max (max <= 0 means 1).
func (z Zone) Over(max float64) []string {
	if max <= 0 {
		max = 1
	}
	var out []string
	for _, r := range Resources {
		if z.Ratio(r) > max {
			out = append(out, r)
		}
	}
	return out
}

// Compare sums slots per zone against hosts (the zones read; a zone
// without a reading is left out), ordered by zone.
func Compare(hosts map[string]hypervisors.HostCapacity, slots []Slot, spec TypeSpec) []Zone {
	sums := Sum(slots, spec)
	out := make([]Zone, 0, len(hosts))
	for z, h := range hosts {
		out = append(out, Zone{Zone: z, Host: h, Offered: sums[z].Offered, Running: sums[z].Running})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Zone < out[j].Zone })
	return out
}

// Sum sums slots per zone, what they offer and what runs, with no host
// (every zone that has a slot of a known type).
func Sum(slots []Slot, spec TypeSpec) map[string]Zone {
	by := map[string]Zone{}
	for _, s := range slots {
		vcpu, mib, ok := spec(s.InstanceType)
		if !ok {
			continue
		}
		u := Usage{VCPU: vcpu, MemoryBytes: uint64(mib) << 20}
		z := by[s.Zone]
		z.Zone = s.Zone
		z.Offered.add(u)
		if s.Running {
			z.Running.add(u)
		}
		by[s.Zone] = z
	}
	return by
}

func (u *Usage) add(v Usage) {
	u.VCPU += v.VCPU
	u.MemoryBytes += v.MemoryBytes
}

// Read asks r for every zone's capacity, all zones at once, each within
// timeout. A zone whose read failed, or that reported nothing (a zero
// HostCapacity), is absent from hosts; its error is in errs.
func Read(ctx context.Context, r hypervisors.CapacityReader, zones []string, timeout time.Duration) (hosts map[string]hypervisors.HostCapacity, errs map[string]error) {
	hosts, errs = map[string]hypervisors.HostCapacity{}, map[string]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, z := range zones {
		wg.Add(1)
		go func() {
			defer wg.Done()
			zctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			h, err := r.ReadCapacity(zctx, z)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				errs[z] = fmt.Errorf("read capacity of zone %s: %w", z, err)
			case h != (hypervisors.HostCapacity{}):
				hosts[z] = h
			}
		}()
	}
	wg.Wait()
	return hosts, errs
}
