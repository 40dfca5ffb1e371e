package server

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/bigfleet-vm/provider/capacity"
	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/metrics"
)

// capacityReadTimeout bounds the capacity read of one zone.
const capacityReadTimeout = 30 * time.Second

// hostCheck returns the reconciler's HostCheck: on every full pass it
// reads each zone's capacity (when the adapter can), compares the slots
// with it, publishes the figures on the term's metrics and warns, once
// per change, about a zone whose offerings exceed its host by more than
// maxRatio. nil when the adapter cannot read capacity.
func hostCheck(hv hypervisors.Hypervisor, spec capacity.TypeSpec, maxRatio float64, timeout time.Duration, m *metrics.Term, log *slog.Logger) func(context.Context, []*desired.Machine) {
	cr, ok := hypervisors.Find[hypervisors.CapacityReader](hv)
	if !ok {
		return nil
	}
	var mu sync.Mutex
	warned := map[string]string{}     // zone -> the resources last warned about
	readFailed := map[string]string{} // zone -> the read error last logged
	return func(ctx context.Context, machines []*desired.Machine) {
		hosts, errs := capacity.Read(ctx, cr, hv.Zones(), timeout)
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
func refuseOver(ctx context.Context, hv hypervisors.Hypervisor, machines []*desired.Machine, spec capacity.TypeSpec, maxRatio float64, log *slog.Logger) error {
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
