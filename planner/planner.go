package planner

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/observed"
)

// Config is everything besides desired and observed state that shapes a
// plan. It is plain data.
type Config struct {
	// Plugin plans what is particular to the hypervisor: its VMs' creation
	// and teardown, and its bootstrap hook.
	Plugin       Plugin
	Installation string
	// NodeReadyExec, when set, gates CONFIGURED on a command succeeding in
	// the guest.
	NodeReadyExec []string
	// StopGrace bounds the graceful shutdown before a power-off on Delete.
	StopGrace time.Duration
	// ReapFailed destroys the VM behind a FAILED on_demand machine (the
	// record stays FAILED).
	ReapFailed bool
}

// Inputs is what one full planning pass reads.
type Inputs struct {
	Config   Config
	Machines []*desired.Machine // sorted by id
	Observed *observed.Snapshot
	// Index of Observed for Config.Installation, if the caller has one.
	Index   *observed.Index
	Lineage string
	Serial  uint64
	Now     time.Time
}

// Plan computes the plan for every machine plus the findings about VMs no
// machine claims. It is pure and deterministic.
func Build(in Inputs) *Plan {
	ix := in.Index
	if ix == nil {
		ix = observed.NewIndex(in.Observed, in.Config.Installation)
	}
	p := &Plan{
		Hypervisor:   in.Config.Plugin.Name(),
		Installation: in.Config.Installation,
		Lineage:      in.Lineage,
		Serial:       in.Serial,
		PlannedAt:    in.Now,
		Changes:      []Change{},
		Drift:        []Drift{},
	}
	if in.Observed != nil {
		p.ObservedAt = in.Observed.At
		for _, name := range in.Observed.ZoneNames() {
			z := in.Observed.Zones[name]
			p.Zones = append(p.Zones, Zone{Name: name, Status: string(z.Status), Error: z.Err})
			if z.Status != observed.StatusOK {
				p.Drift = append(p.Drift, Drift{Zone: name, Kind: DriftUnknownHost, Policy: PolicyReport,
					Detail: "host cannot be observed: " + z.Err + "; nothing is created or destroyed there"})
			}
		}
	}
	known := make(map[string]bool, len(in.Machines))
	// One planner serves every machine: it escapes to the heap (the
	// plug-in receives it as a Builder), so it is allocated once a pass,
	// not once a machine.
	pl := &machinePlanner{cfg: in.Config, ix: ix, now: in.Now}
	for _, m := range in.Machines {
		known[m.ID] = true
		c, drift := pl.machine(m)
		p.Drift = append(p.Drift, drift...)
		if !c.Empty() || c.Wait != "" {
			p.Changes = append(p.Changes, c)
		}
	}
	// Owned VMs that no machine claims: adopt them so they stay visible
	// and deletable.
	for _, id := range ix.OwnedIDs(func(id string) bool { return !known[id] }) {
		vm, _ := ix.Owned(id)
		d := Drift{Machine: id, Zone: vm.Zone, VM: vm.Name, Kind: DriftOrphan, Policy: PolicyAdopt,
			Detail: "VM carries this installation's marker for a machine not in the inventory"}
		p.Drift = append(p.Drift, d)
		p.Changes = append(p.Changes, Change{Machine: id, Zone: vm.Zone, State: "UNKNOWN",
			Adopt: adoptOf(vm)})
	}
	sort.SliceStable(p.Changes, func(i, j int) bool { return p.Changes[i].Machine < p.Changes[j].Machine })
	sort.SliceStable(p.Drift, func(i, j int) bool {
		a, b := p.Drift[i], p.Drift[j]
		if a.Zone != b.Zone {
			return a.Zone < b.Zone
		}
		if a.Machine != b.Machine {
			return a.Machine < b.Machine
		}
		return a.Kind < b.Kind
	})
	p.Summary = summarize(p)
	return p
}

func summarize(p *Plan) Summary {
	var s Summary
	for _, c := range p.Changes {
		s.Steps += len(c.Steps)
		switch {
		case c.Fail != "":
			s.Fail++
		case c.Adopt != nil:
			s.Adopt++
		case c.Intent != nil:
			switch desired.Kind(c.Intent.Kind) {
			case desired.KindCreate:
				s.Create++
			case desired.KindConfigure:
				s.Configure++
			case desired.KindDrain:
				s.Drain++
			case desired.KindDelete:
				s.Delete++
			}
		case len(c.Steps) > 0:
			s.Repair++
		}
	}
	s.Drift = len(p.Drift)
	return s
}

func adoptOf(vm *observed.VM) *Adopt {
	a := &Adopt{Host: vm.Ref(), VMName: vm.Name, VMID: vm.VMID}
	if vm.Marker != nil {
		a.Cluster = vm.Marker.Cluster
		a.InstanceType = vm.Marker.InstanceType
	}
	return a
}

// Machine plans one machine. It costs O(1) index lookups, so a single
// machine can be re-planned in microseconds.
func Machine(cfg Config, m *desired.Machine, ix *observed.Index, now time.Time) (Change, []Drift) {
	pl := &machinePlanner{cfg: cfg, ix: ix, now: now}
	return pl.machine(m)
}

// machine plans m, starting afresh.
func (p *machinePlanner) machine(m *desired.Machine) (Change, []Drift) {
	p.m, p.c, p.drift, p.last = m, Change{}, nil, ""
	return p.plan()
}

type machinePlanner struct {
	cfg   Config
	m     *desired.Machine
	ix    *observed.Index
	now   time.Time
	c     Change
	drift []Drift
	last  string // id of the previous step, for dependencies
}

func (p *machinePlanner) plan() (Change, []Drift) {
	m := p.m
	p.c = Change{Machine: m.ID, Zone: m.Zone, State: m.State.String()}
	if in := m.Intent; in != nil {
		p.c.Intent = &Intent{Kind: string(in.Kind), OpID: in.OpID, Grace: in.GraceSeconds}
		if in.Kind == desired.KindConfigure {
			p.c.Intent.Cluster = m.Cluster
		}
		if !in.Deadline.IsZero() && p.now.After(in.Deadline) {
			p.c.Fail = fmt.Sprintf("%s timed out after %s", in.Kind, in.Deadline.Sub(in.Started).Round(time.Second))
			return p.c, p.drift
		}
	}
	z := p.ix.Zone(m.Zone)
	if z == nil || z.Status != observed.StatusOK {
		if m.State != desired.Speculative || m.Intent != nil {
			p.c.Wait = "host " + m.Zone + " is unknown"
		}
		return p.c, p.drift
	}
	vm, others := p.findVM()
	if vm != nil {
		p.c.VM = &hypervisors.Target{Zone: vm.Zone, Name: vm.Name, VMID: vm.VMID}
	} else if m.VMName != "" && m.State == desired.Creating {
		p.c.VM = &hypervisors.Target{Zone: m.Zone, Name: m.VMName}
	}
	for _, o := range others {
		p.addDrift(DriftLeaked, PolicyReport, o.Name, fmt.Sprintf("another VM (%s) carries this machine's marker", o.Ref()))
	}
	switch m.State {
	case desired.Speculative:
		p.speculative(vm, z)
	case desired.Creating:
		p.creating(vm)
	case desired.Idle, desired.Configured:
		p.stable(vm, z)
	case desired.Configuring:
		if p.needVM(vm, z) {
			p.ensureRunning(vm, "intent:configure")
			p.waitAgent(vm, "intent:configure")
			mk := p.marker(m.Cluster)
			p.add(ActionBind, vm, "", Params{Marker: &mk}, "intent:configure")
			argv, blob := p.cfg.Plugin.Bootstrap(m)
			p.add(ActionExecBootstrap, vm, "", Params{Exec: argv, BlobPath: blob}, "intent:configure")
			if len(p.cfg.NodeReadyExec) > 0 {
				p.add(ActionExecReady, vm, "", Params{Exec: p.cfg.NodeReadyExec}, "intent:configure")
			}
			p.c.Finish = desired.Configured.String()
		}
	case desired.Draining:
		if p.needVM(vm, z) {
			p.ensureRunning(vm, "intent:drain")
			p.waitAgent(vm, "intent:drain")
			p.add(ActionExecDrain, vm, "", Params{Exec: DrainArgv(m.Intent.GraceSeconds)}, "intent:drain")
			mk := p.marker("")
			p.add(ActionUnbind, vm, "", Params{Marker: &mk}, "intent:drain")
			p.c.Finish = desired.Idle.String()
		}
	case desired.Deleting:
		p.destroy(vm, "intent:delete", false)
		p.c.Finish = desired.Speculative.String()
	case desired.Failed:
		if p.cfg.ReapFailed && m.Capacity != desired.BareMetal {
			p.destroy(vm, "gc:failed", true)
		}
	}
	return p.c, p.drift
}

// findVM returns the machine's VM (the owned VM in its zone matching its
// current name or VMID, else any owned VM for it, its own zone first) and
// any further owned VMs (leaks).
func (p *machinePlanner) findVM() (*observed.VM, []*observed.VM) {
	first, more := p.ix.Owned(p.m.ID)
	if first == nil || len(more) == 0 {
		return first, nil
	}
	owned := append([]*observed.VM{first}, more...)
	score := func(vm *observed.VM) int {
		n := 0
		if vm.Zone == p.m.Zone {
			n += 2
		}
		if p.m.VMID != 0 && vm.VMID == p.m.VMID || p.m.VMID == 0 && vm.Name == p.m.VMName {
			n++
		}
		return n
	}
	best := first
	for _, vm := range owned[1:] {
		if score(vm) > score(best) {
			best = vm
		}
	}
	var others []*observed.VM
	for _, vm := range owned {
		if vm != best {
			others = append(others, vm)
		}
	}
	return best, others
}

// observedAfter reports whether the zone's VM listing postdates t, so an
// absence in it is evidence.
func (p *machinePlanner) observedAfter(z *observed.Zone, t time.Time) bool {
	return !z.At.Before(t)
}

func (p *machinePlanner) speculative(vm *observed.VM, z *observed.Zone) {
	if vm == nil || vm.Power != observed.PowerRunning || !p.observedAfter(z, p.m.Since) {
		// A shut-off owned VM stays behind a SPECULATIVE slot until a
		// Create powers it back on; a listing older than the slot's last
		// change (e.g. a Delete that just finished) proves nothing.
		return
	}
	p.addDrift(DriftOrphan, PolicyAdopt, vm.Name, "running VM carries this machine's marker; adopting it")
	p.c.Adopt = adoptOf(vm)
}

func (p *machinePlanner) creating(vm *observed.VM) {
	p.cfg.Plugin.Create(p.builder(), vm)
	if p.c.Fail != "" {
		return
	}
	p.waitAgent(vm, "intent:create")
	p.c.Finish = desired.Idle.String()
}

// stable checks an IDLE or CONFIGURED machine's VM against what it should be.
func (p *machinePlanner) stable(vm *observed.VM, z *observed.Zone) {
	m := p.m
	if vm == nil {
		if !p.observedAfter(z, m.Since) {
			return // the listing predates the machine settling here
		}
		what := "VM " + m.Host
		p.addDrift(DriftMissing, PolicyFail, m.VMName, what+" is gone")
		p.c.Fail = fmt.Sprintf("%s vanished out of band while the machine was %s; the provider does not recreate it silently", what, m.State)
		return
	}
	switch vm.Power {
	case observed.PowerStopped, observed.PowerCrashed:
		p.addDrift(DriftStopped, PolicyRepair, vm.Name, "VM is "+string(vm.Power)+"; starting it again")
	case observed.PowerPaused:
		p.addDrift(DriftPaused, PolicyRepair, vm.Name, "VM is paused; resuming it")
	}
	p.ensureRunning(vm, "drift:"+string(vm.Power))
	// A machine adopted with an instance type missing from the catalog has
	// no size to compare against.
	if vm.VCPU != 0 && m.VCPU != 0 && m.MemoryMiB != 0 && (vm.VCPU != m.VCPU || vm.MemoryMiB != m.MemoryMiB) {
		p.addDrift(DriftResized, PolicyReport, vm.Name, fmt.Sprintf("VM has %d vCPU / %d MiB; %s is %d vCPU / %d MiB", vm.VCPU, vm.MemoryMiB, m.InstanceType, m.VCPU, m.MemoryMiB))
	}
}

// needVM fails the change when the VM a transition needs is gone.
func (p *machinePlanner) needVM(vm *observed.VM, z *observed.Zone) bool {
	if vm != nil {
		return true
	}
	if !p.observedAfter(z, p.m.Since) {
		p.c.Wait = "waiting for a fresh observation of " + p.m.Zone
		return false
	}
	p.addDrift(DriftMissing, PolicyFail, p.m.VMName, "VM "+p.m.Host+" is gone")
	p.c.Fail = fmt.Sprintf("VM %s vanished out of band during %s", p.m.Host, p.m.Intent.Kind)
	return false
}

func (p *machinePlanner) ensureRunning(vm *observed.VM, reason string) {
	switch vm.Power {
	case observed.PowerStopped, observed.PowerCrashed:
		p.add(ActionStart, vm, "", Params{}, reason)
	case observed.PowerPaused:
		p.add(ActionResume, vm, "", Params{}, reason)
	}
}

func (p *machinePlanner) waitAgent(vm *observed.VM, reason string) {
	if vm == nil {
		p.addStep(ActionWaitAgent, hypervisors.Target{Zone: p.m.Zone, Name: p.m.VMName}, "", Params{}, reason)
		return
	}
	p.add(ActionWaitAgent, vm, "", Params{}, reason)
}

// destroy plans the teardown of a machine's VM and what it owns: the core
// stops the VM, the plug-in destroys it. leftovers (reaping a FAILED
// machine, which has no intent whose start could make an absence
// unreliable): only what the observation shows.
func (p *machinePlanner) destroy(vm *observed.VM, reason string, leftovers bool) {
	if vm != nil && vm.Power != observed.PowerStopped {
		p.add(ActionStop, vm, "", Params{Grace: Duration(p.cfg.StopGrace)}, reason)
	}
	p.cfg.Plugin.Destroy(p.builder(), vm, reason, leftovers)
}

func (p *machinePlanner) marker(cluster string) observed.Marker {
	op := ""
	if p.m.Ops != nil {
		op = p.m.Ops[desired.KindCreate].ID
	}
	return observed.Marker{Installation: p.cfg.Installation, MachineID: p.m.ID, OpID: op,
		InstanceType: p.m.InstanceType, Cluster: cluster}
}

// DrainArgv is the in-guest drain: cordon, then drain honouring the grace
// period. Zero grace drains immediately (pods are deleted without waiting)
// rather than giving kubectl a one-second timeout; the Drain deadline
// bounds the whole command.
func DrainArgv(grace int64) []string {
	flags := "--ignore-daemonsets --delete-emptydir-data"
	if grace == 0 {
		flags += " --grace-period=0 --force"
	} else {
		g := strconv.FormatInt(grace, 10)
		flags += " --grace-period=" + g + " --timeout=" + strconv.FormatInt(grace+60, 10) + "s"
	}
	script := strings.Join([]string{
		"set -eu",
		`node="$(hostname)"`,
		`kubectl cordon "$node"`,
		`kubectl drain "$node" ` + flags,
	}, "\n")
	return []string{"/bin/sh", "-c", script}
}

func (p *machinePlanner) add(a Action, vm *observed.VM, detail string, params Params, reason string) {
	p.addStep(a, hypervisors.Target{Zone: vm.Zone, Name: vm.Name, VMID: vm.VMID}, detail, params, reason)
}

func (p *machinePlanner) addStep(a Action, t hypervisors.Target, detail string, params Params, reason string) {
	var deps []string
	if p.last != "" {
		deps = []string{p.last}
	}
	p.addStepDeps(a, t, detail, params, reason, deps)
}

func (p *machinePlanner) addStepDeps(a Action, t hypervisors.Target, detail string, params Params, reason string, deps []string) {
	name := t.Name
	if name == "" {
		name = p.m.VMName
	}
	var id string
	if detail == "" {
		id = t.Zone + "/" + name + "/" + string(a)
	} else {
		id = t.Zone + "/" + name + "/" + string(a) + ":" + detail // one concatenation, not two
	}
	p.c.Steps = append(p.c.Steps, Step{ID: id, Action: a, Target: t, DependsOn: deps, Params: params, Reason: reason})
	p.last = id
}

func (p *machinePlanner) addDrift(k DriftKind, pol Policy, vm, detail string) {
	p.drift = append(p.drift, Drift{Machine: p.m.ID, Zone: p.m.Zone, VM: vm, Kind: k, Policy: pol, Detail: detail})
}
