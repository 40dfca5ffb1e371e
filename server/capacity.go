package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bigfleet-vm/provider/capacity"
	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/jsonplan"
	"github.com/bigfleet-vm/provider/metrics"
)

// capacityReadTimeout bounds the capacity read of one zone.
const capacityReadTimeout = 30 * time.Second

// hostCheck returns the reconciler's HostCheck: on every full pass it
// reads each zone's capacity (when the adapter can), compares the slots
// with it, publishes the figures on the term's metrics and warns, once
// per change, about a zone whose offerings exceed its host by more than
// maxRatio. nil when the adapter cannot read capacity.
func hostCheck(hv hypervisors.Hypervisor, latest *capacity.Latest, l *ledger, spec capacity.TypeSpec, maxRatio float64, timeout time.Duration, m *metrics.Term, log *slog.Logger) func(context.Context, []*desired.Machine) {
	cr, ok := hypervisors.Find[hypervisors.CapacityReader](hv)
	if !ok {
		return nil
	}
	var mu sync.Mutex
	warned := map[string]string{}     // zone -> the resources last warned about
	readFailed := map[string]string{} // zone -> the read error last logged
	return func(ctx context.Context, machines []*desired.Machine) {
		hosts, errs := capacity.Read(ctx, cr, hv.Zones(), timeout)
		if ctx.Err() == nil { // a read cut short by a stop says nothing of the host
			latest.Record(hv.Zones(), hosts, errs, time.Now())
		}
		if l != nil {
			l.pass(machines)
		}
		mu.Lock()
		for _, z := range hv.Zones() {
			err, failed := errs[z]
			switch {
			case !failed:
				delete(readFailed, z)
			case ctx.Err() == nil && readFailed[z] != err.Error():
				// Once per distinct failure: a host that stays down is
				// zone_up's to report, not a warning every pass.
				readFailed[z] = err.Error()
				log.Warn("read host capacity", "zone", z, "err", err)
			}
		}
		mu.Unlock()
		zones := capacity.Compare(hosts, slotsOf(machines), spec)
		m.ZoneCapacity(zones)
		mu.Lock()
		defer mu.Unlock()
		for _, z := range zones {
			over := z.Over(maxRatio)
			key := strings.Join(over, ",")
			if key == warned[z.Zone] {
				continue
			}
			warned[z.Zone] = key
			if len(over) == 0 {
				log.Info("zone offerings fit the host", "zone", z.Zone)
				continue
			}
			log.Warn("zone offerings exceed the host beyond the overcommit ratio", "max_ratio", maxRatio, "zone", z.Zone, "resources", key,
				"cpu_ratio", z.Ratio(capacity.CPU), "memory_ratio", z.Ratio(capacity.Memory),
				"offered_vcpu", z.Offered.VCPU, "host_cpus", z.Host.CPUs,
				"offered_memory_bytes", z.Offered.MemoryBytes, "host_memory_bytes", z.Host.MemoryBytes)
		}
	}
}

// slotsOf is what capacity needs of the machines.
func slotsOf(machines []*desired.Machine) []capacity.Slot {
	slots := make([]capacity.Slot, 0, len(machines))
	for _, mc := range machines {
		slots = append(slots, capacity.Slot{Zone: mc.Zone, InstanceType: mc.InstanceType, Running: mc.State != desired.Speculative})
	}
	return slots
}

// refuseOver is --capacity-check=refuse at start: it reads every zone's
// capacity (waiting, within the read's bound, for an adapter that dials
// its hosts in the background) and fails, naming every zone and resource
// with their figures, when a zone's offerings exceed its host by more than
// maxRatio. A zone whose capacity cannot be read does not stop the start
// (it is logged): refuse holds back what is known to be over, not what is
// unknown.
func refuseOver(ctx context.Context, hv hypervisors.Hypervisor, latest *capacity.Latest, machines []*desired.Machine, spec capacity.TypeSpec, maxRatio float64, log *slog.Logger) error {
	cr, ok := hypervisors.Find[hypervisors.CapacityReader](hv)
	if !ok {
		log.Warn("--capacity-check=refuse: this hypervisor cannot report its hosts' capacity; nothing is checked")
		return nil
	}
	if w, ok := hv.(interface{ WaitConnected(context.Context) error }); ok {
		wctx, cancel := context.WithTimeout(ctx, capacityReadTimeout)
		_ = w.WaitConnected(wctx) // a host still down is not read
		cancel()
	}
	hosts, errs := capacity.Read(ctx, cr, hv.Zones(), capacityReadTimeout)
	latest.Record(hv.Zones(), hosts, errs, time.Now())
	for z, err := range errs {
		log.Warn("read host capacity", "zone", z, "err", err)
	}
	var over []string
	for _, z := range capacity.Compare(hosts, slotsOf(machines), spec) {
		for _, r := range z.Over(maxRatio) {
			switch r {
			case capacity.CPU:
				over = append(over, fmt.Sprintf("zone %s: cpu: the offerings place %d vCPUs on a host of %d CPUs (ratio %.2f)", z.Zone, z.Offered.VCPU, z.Host.CPUs, z.Ratio(r)))
			case capacity.Memory:
				over = append(over, fmt.Sprintf("zone %s: memory: the offerings place %d MiB on a host of %d MiB (ratio %.2f)", z.Zone, z.Offered.MemoryBytes>>20, z.Host.MemoryBytes>>20, z.Ratio(r)))
			}
		}
	}
	if len(over) > 0 {
		return fmt.Errorf("--capacity-check=refuse: offerings exceed their hosts beyond the overcommit ratio %v (--capacity-overcommit): %s", maxRatio, strings.Join(over, "; "))
	}
	return nil
}

// holdsHost says whether machine m holds (or is about to hold) host
// resources: in every state but SPECULATIVE (no VM) and FAILED (its VM is
// reaped).
func holdsHost(m *desired.Machine) bool {
	return m.State != desired.Speculative && m.State != desired.Failed
}

// ledger is what each zone's machines hold of their host, for the Create
// check, kept without reading the whole document per Create: the sums of
// the newest full pass (every machine in a state that holds its host,
// holdsHost) plus the Creates admitted since, each reserved by machine id
// until a pass counts it. A machine that stopped holding since the pass
// (deleted, FAILED) is still counted until the next one: the check errs on
// the safe side for at most one pass interval. It holds the newest pass's
// machine list (the document's own immutable values) and at most one
// reservation per machine.
type ledger struct {
	spec capacity.TypeSpec

	mu       sync.Mutex
	machines []*desired.Machine // the newest pass's, sorted by id
	held     map[string]capacity.Usage
	reserved map[string]reservation
}

type reservation struct {
	zone string
	need capacity.Usage
}

func newLedger(spec capacity.TypeSpec) *ledger {
	return &ledger{spec: spec, held: map[string]capacity.Usage{}, reserved: map[string]reservation{}}
}

// pass takes a full pass's machines (sorted by id, as desired.Document.All
// returns them): the sums are theirs, and a reservation is dropped once
// its machine is counted (or holds nothing any more: FAILED, gone); one
// whose machine the pass still saw SPECULATIVE (its Create came after the
// pass's read) is kept.
func (l *ledger) pass(machines []*desired.Machine) {
	held := l.sum(machines)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.machines, l.held = machines, held
	for id := range l.reserved {
		if m := find(machines, id); m == nil || m.State != desired.Speculative {
			delete(l.reserved, id)
		}
	}
}

// start takes the machines that hold their hosts when a term opens
// (sorted by id): the sums are theirs, until the first full pass. Without
// the others, a takeover of a large fleet sorts only what holds a host.
func (l *ledger) start(holding []*desired.Machine) {
	held := l.sum(holding)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.machines, l.held = holding, held
}

// sum is what the machines that hold their hosts hold, by zone.
func (l *ledger) sum(machines []*desired.Machine) map[string]capacity.Usage {
	held := map[string]capacity.Usage{}
	for _, m := range machines {
		if !holdsHost(m) {
			continue
		}
		if vcpu, mib, ok := l.spec(m.InstanceType); ok {
			u := held[m.Zone]
			u.VCPU += vcpu
			u.MemoryBytes += uint64(mib) << 20
			held[m.Zone] = u
		}
	}
	return held
}

// find is machine id in machines (sorted by id), or nil.
func find(machines []*desired.Machine, id string) *desired.Machine {
	i, ok := slices.BinarySearchFunc(machines, id, func(m *desired.Machine, id string) int { return strings.Compare(m.ID, id) })
	if !ok {
		return nil
	}
	return machines[i]
}

// usedBesides is what zone's machines other than m hold.
func (l *ledger) usedBesides(m *desired.Machine, need capacity.Usage) capacity.Usage {
	l.mu.Lock()
	defer l.mu.Unlock()
	used := l.held[m.Zone]
	if c := find(l.machines, m.ID); c != nil && holdsHost(c) && c.Zone == m.Zone {
		used.VCPU = max(used.VCPU-need.VCPU, 0) // itself, counted by the pass
		used.MemoryBytes -= min(used.MemoryBytes, need.MemoryBytes)
	}
	for id, r := range l.reserved {
		if r.zone == m.Zone && id != m.ID {
			used.VCPU += r.need.VCPU
			used.MemoryBytes += r.need.MemoryBytes
		}
	}
	return used
}

// reserve counts m's need in its zone until a pass counts m.
func (l *ledger) reserve(m *desired.Machine, need capacity.Usage) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reserved[m.ID] = reservation{zone: m.Zone, need: need}
}

// hostFit returns the reconciler's HostFit: a Create is held against its
// zone's newest capacity reading (latest, kept by the full pass: no
// hypervisor call of its own) and what the zone's other machines hold
// (the ledger: no pass over the document either): its memory must fit
// the host; with holdCPU (--capacity-check=refuse) its vCPUs must fit the
// host's CPUs times maxRatio too (under warn, vCPU overcommit is the
// operator's call: the full pass warns about it, a Create is not failed
// for it); a Create that fits
// is reserved in the ledger, so Creates admitted together are counted
// together. A zone without a reading is not checked (unknown is not
// short). Given a hypervisor's refusal for lack of resources
// (hypervisors.ResourceError) it names the resource with the figures it
// has instead.
func hostFit(latest *capacity.Latest, l *ledger, spec capacity.TypeSpec, maxRatio float64, holdCPU bool) func(*desired.Machine, error) string {
	return func(m *desired.Machine, err error) string {
		vcpu, mib, ok := spec(m.InstanceType)
		if !ok {
			return ""
		}
		need := capacity.Usage{VCPU: vcpu, MemoryBytes: uint64(mib) << 20}
		r, read := latest.Get(m.Zone)
		read = read && r.Err == nil && r.Host != (hypervisors.HostCapacity{})
		var re *hypervisors.ResourceError
		if err != nil && !errors.As(err, &re) {
			return ""
		}
		if err == nil && !read {
			return ""
		}
		var held capacity.Usage
		if read {
			held = l.usedBesides(m, need)
		}
		if err == nil {
			host := r.Host
			if !holdCPU {
				host.CPUs = 0 // not checked
			}
			if s := capacity.Fit(m.Zone, host, held, need, maxRatio); s != nil {
				return s.Error()
			}
			l.reserve(m, need)
			return ""
		}
		s := &capacity.Short{Zone: m.Zone, Resource: re.Resource, Cause: err}
		switch re.Resource {
		case capacity.Memory:
			s.Need, s.Unread = need.MemoryBytes, !read || r.Host.MemoryBytes == 0
			if !s.Unread {
				s.Free = r.Host.MemoryBytes - min(r.Host.MemoryBytes, held.MemoryBytes)
			}
		case capacity.Disk:
			s.Unread = !read || r.Host.StorageName == ""
			s.Free, s.Storage = r.Host.DiskFreeBytes, r.Host.StorageName
		}
		return s.Error()
	}
}

// capacityUnread is a zone's capacity status before its first read.
const capacityUnread = "not read yet (the first full pass has not finished)"

// capacitySection is the plan's capacity section: every zone's offerings
// and running machines (from machines) against its reading in latest
// (zones, hv.Zones()); a zone without a usable reading says why, with no
// host figures. canRead false: the adapter cannot read capacity at all.
func capacitySection(zones []string, canRead bool, latest *capacity.Latest, machines []*desired.Machine, spec capacity.TypeSpec, maxRatio float64) *jsonplan.Capacity {
	sums := capacity.Sum(slotsOf(machines), spec)
	out := &jsonplan.Capacity{MaxRatio: maxRatio, Zones: make([]jsonplan.ZoneCapacity, 0, len(zones))}
	for _, z := range slices.Sorted(slices.Values(zones)) {
		sum := sums[z]
		zc := jsonplan.ZoneCapacity{Zone: z, Status: "unknown",
			Offered: jsonplan.Resources(sum.Offered), Running: jsonplan.Resources(sum.Running)}
		r, ok := latest.Get(z)
		switch {
		case !canRead:
			zc.Error = "this hypervisor cannot read its hosts' capacity"
		case !ok:
			zc.Error = capacityUnread
		case r.Err != nil:
			zc.Error = r.Err.Error()
		case r.Host == (hypervisors.HostCapacity{}):
			zc.Error = "the host reported no capacity"
		default:
			at := r.At.UTC()
			sum.Host = r.Host
			zc.Status, zc.ReadAt = "ok", &at
			zc.Host = &jsonplan.Host{CPUs: r.Host.CPUs, MemoryBytes: r.Host.MemoryBytes}
			if r.Host.StorageName != "" {
				zc.Host.Disk = &jsonplan.Disk{Storage: r.Host.StorageName, TotalBytes: r.Host.DiskBytes, FreeBytes: r.Host.DiskFreeBytes}
			}
			if r.Host.CPUs > 0 {
				zc.CPURatio = rounded(sum.Ratio(capacity.CPU))
			}
			if r.Host.MemoryBytes > 0 {
				zc.MemoryRatio = rounded(sum.Ratio(capacity.Memory))
			}
			zc.Over = sum.Over(maxRatio)
		}
		out.Zones = append(out.Zones, zc)
	}
	return out
}

// rounded is v to 3 decimals, for the plan.
func rounded(v float64) *float64 {
	v = math.Round(v*1000) / 1000
	return &v
}

// catalogSpec sizes the instance types of cfg's catalog.
func catalogSpec(cfg *config.Config) capacity.TypeSpec {
	return func(name string) (int, int, bool) {
		it, ok := cfg.Catalog[name]
		return it.VCPU, it.MemoryMiB, ok
	}
}
