package planner

import (
	"time"

	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/observed"
)

// Plugin answers the planner's questions about one hypervisor: how a
// machine's VM comes into existence and goes away, as steps of the
// hypervisor's own vocabulary. The planner keeps the state machine, the
// power and guest steps and the drift rules; it never asks which
// hypervisor it plans for. A Plugin is pure (no I/O, no clock) and holds
// the hypervisor's resolved settings.
type Plugin interface {
	// Name is the plan's "hypervisor".
	Name() string
	// Actions describes every action the plug-in's steps use.
	Actions() []hypervisors.ActionInfo
	// DriftKinds are the kinds of drift its plans report besides the
	// core's (DriftKinds), such as a volume of its own that is wrong.
	DriftKinds() []DriftKind
	// Observation says how the reconciler finds a machine's VM and
	// whether a listing is evidence about volumes.
	Observation() Observation
	// Create appends what brings the machine's VM into existence and
	// running, from vm (nil: no owned VM observed), up to (not including)
	// waiting for its guest agent. It may Fail the change.
	Create(b *Builder, vm *observed.VM)
	// Destroy appends the teardown after the core stopped the VM: the VM
	// (if not nil) and what it owns. leftovers (reaping a FAILED machine):
	// only objects the observation shows; else also those a listing older
	// than the intent could miss.
	Destroy(b *Builder, vm *observed.VM, reason string, leftovers bool)
	// Bootstrap is the in-guest argv of the bootstrap hook for m and the
	// path its blob is written to first.
	Bootstrap(m *desired.Machine) (argv []string, blobPath string)
	// Volumes names the volumes m's plan depends on (nil: none); the
	// reconciler reads them before planning a Create, a Delete or a reap.
	Volumes(m *desired.Machine) (pool string, names []string)
}

// Identity is how a machine's VM is named to the hypervisor.
type Identity int

const (
	// ByName: the deterministic VM name (m.VMName).
	ByName Identity = iota
	// ByID: the VMID allocated at create and recorded on the machine.
	ByID
)

// Observation is how a hypervisor's VMs are found and listed.
type Observation struct {
	Identity Identity
	// Volumes: a zone listing includes its volumes, so an absent volume
	// is evidence (Zone.VolumesAt).
	Volumes bool
}

// Builder appends steps to one machine's change on behalf of a Plugin.
// It is valid only during the Plugin call that received it.
type Builder machinePlanner

func (p *machinePlanner) builder() *Builder { return (*Builder)(p) }

// Machine is the machine being planned.
func (b *Builder) Machine() *desired.Machine { return b.m }

// Index is the observation the plan is built from.
func (b *Builder) Index() *observed.Index { return b.ix }

// IntentStarted is when the machine's intent started (else since when it
// has been in its state): a listing older than it proves no absence.
func (b *Builder) IntentStarted() time.Time {
	if b.m.Intent != nil {
		return b.m.Intent.Started
	}
	return b.m.Since
}

// Zone is the observation of the machine's zone.
func (b *Builder) Zone() *observed.Zone { return b.ix.Zone(b.m.Zone) }

// Marker is the ownership marker the machine's VM carries, bound to
// cluster ("" while unbound).
func (b *Builder) Marker(cluster string) observed.Marker { return (*machinePlanner)(b).marker(cluster) }

// Add appends a plug-in step after the previous step and returns its id
// "<zone>/<vm>/<action>[:<detail>]".
func (b *Builder) Add(t hypervisors.Target, detail string, sp hypervisors.StepParams, reason string) string {
	p := (*machinePlanner)(b)
	p.addStep(Action(sp.Info().Name), t, detail, Params{Plugin: sp}, reason)
	return p.last
}

// AddAfter appends a plug-in step that depends on deps only (nil: on
// nothing, so it may run at once).
func (b *Builder) AddAfter(t hypervisors.Target, detail string, sp hypervisors.StepParams, reason string, deps []string) string {
	p := (*machinePlanner)(b)
	p.addStepDeps(Action(sp.Info().Name), t, detail, Params{Plugin: sp}, reason, deps)
	return p.last
}

// AddOn appends a plug-in step on the observed vm, after the previous step.
func (b *Builder) AddOn(vm *observed.VM, detail string, sp hypervisors.StepParams, reason string) string {
	return b.Add(hypervisors.Target{Zone: vm.Zone, Name: vm.Name, VMID: vm.VMID}, detail, sp, reason)
}

// Start appends the core start of a VM the observation does not show yet.
func (b *Builder) Start(t hypervisors.Target, reason string) string {
	p := (*machinePlanner)(b)
	p.addStep(ActionStart, t, "", Params{}, reason)
	return p.last
}

// EnsureRunning appends the core start or resume an observed vm needs.
func (b *Builder) EnsureRunning(vm *observed.VM, reason string) {
	(*machinePlanner)(b).ensureRunning(vm, reason)
}

// Drift records a finding about the machine.
func (b *Builder) Drift(k DriftKind, pol Policy, vm, detail string) {
	(*machinePlanner)(b).addDrift(k, pol, vm, detail)
}

// Fail fails the change: the machine goes FAILED with msg as last_error.
func (b *Builder) Fail(msg string) { b.c.Fail = msg }

// Failed reports whether the change has been failed.
func (b *Builder) Failed() bool { return b.c.Fail != "" }
