package planner_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
	"github.com/bigfleet-vm/provider/naming"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/planner"
)

// fleet builds n machines over 50 zones: 1% with a pending Create intent,
// the rest IDLE with a running VM; 1% of those VMs are stopped (drift).
func fleet(n int) ([]*desired.Machine, *observed.Snapshot, planner.Config) {
	const inst = "bench"
	cfg := planner.Config{Plugin: libvirt.Planner(libvirt.PlanSettings{Pool: "default", Image: "golden.qcow2", Network: "default",
		DomainType: "kvm"}), Installation: inst, StopGrace: time.Minute, ReapFailed: true}
	snap := &observed.Snapshot{Zones: map[string]*observed.Zone{}, At: t0}
	for z := range 50 {
		name := fmt.Sprintf("host-%02d", z)
		snap.Zones[name] = &observed.Zone{Name: name, Status: observed.StatusOK, At: t0, VolumesAt: t0}
	}
	machines := make([]*desired.Machine, 0, n)
	for i := range n {
		id := fmt.Sprintf("m%06d", i)
		zone := fmt.Sprintf("host-%02d", i%50)
		m := &desired.Machine{ID: id, Zone: zone, InstanceType: "kvm.small", Capacity: desired.OnDemand, VCPU: 2, MemoryMiB: 2048,
			Since: t0.Add(-time.Hour), Cycle: 1, VMName: naming.VMName(inst, id, 1),
			Ops: map[desired.Kind]desired.OpRecord{desired.KindCreate: {ID: "op-1"}}}
		if i%100 == 0 {
			m.State = desired.Creating
			m.Intent = &desired.Intent{Kind: desired.KindCreate, OpID: "op-1", Started: t0.Add(-time.Minute), Deadline: t0.Add(5 * time.Minute)}
			machines = append(machines, m)
			continue
		}
		m.State = desired.Idle
		m.Host = zone + "/" + m.VMName
		power := observed.PowerRunning
		if i%100 == 1 {
			power = observed.PowerStopped
		}
		z := snap.Zones[zone]
		z.VMs = append(z.VMs, &observed.VM{Zone: zone, Name: m.VMName, Power: power, VCPU: 2, MemoryMiB: 2048, Autostart: true,
			Marker: &observed.Marker{Installation: inst, MachineID: id, OpID: "op-1", InstanceType: "kvm.small"}})
		z.Volumes = append(z.Volumes, &observed.Volume{Zone: zone, Pool: "default", Name: lvspec.OverlayVolume(m.VMName)},
			&observed.Volume{Zone: zone, Pool: "default", Name: lvspec.SeedVolume(m.VMName)})
		machines = append(machines, m)
	}
	return machines, snap, cfg
}

// BenchmarkBuild100k plans a 100,000-machine fleet with 1% pending
// intents and 1% drift (target: < 300 ms/op). The observed index is built
// inside Build, so it is part of the measurement.
func BenchmarkBuild100k(b *testing.B) {
	machines, snap, cfg := fleet(100_000)
	in := planner.Inputs{Config: cfg, Machines: machines, Observed: snap, Lineage: "bench", Serial: 1, Now: t0}
	p := planner.Build(in)
	if p.Summary.Create != 1000 || p.Summary.Repair != 1000 || p.Summary.Drift != 1000 {
		b.Fatalf("unexpected plan summary %+v", p.Summary)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		planner.Build(in)
	}
}

// BenchmarkMachine re-plans one drifted machine against a prebuilt index
// of the 100,000-machine snapshot (target: microseconds).
func BenchmarkMachine(b *testing.B) {
	machines, snap, cfg := fleet(100_000)
	ix := observed.NewIndex(snap, cfg.Installation)
	m := machines[1] // IDLE with a stopped VM
	c, drift := planner.Machine(cfg, m, ix, t0)
	if len(c.Steps) != 1 || len(drift) != 1 {
		b.Fatalf("unexpected change %+v drift %+v", c, drift)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		planner.Machine(cfg, m, ix, t0)
	}
}
