package planner

import (
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/jsonplan"
	"github.com/bigfleet-vm/provider/observed"
)

// Action is a step kind from a closed set.
type Action string

const (
	ActionCreateOverlay Action = "create-overlay"
	ActionCreateSeed    Action = "create-seed"
	ActionDefine        Action = "define"
	ActionClone         Action = "clone"
	ActionConfigureVM   Action = "configure-vm"
	ActionStart         Action = "start"
	ActionResume        Action = "resume"
	ActionAutostart     Action = "autostart"
	ActionWaitAgent     Action = "wait-agent"
	ActionBind          Action = "bind"
	ActionExecBootstrap Action = "exec-bootstrap"
	ActionExecReady     Action = "exec-ready"
	ActionExecDrain     Action = "exec-drain"
	ActionUnbind        Action = "unbind"
	ActionStop          Action = "stop"
	ActionUndefine      Action = "undefine"
	ActionDeleteVolume  Action = "delete-volume"
	ActionDeleteVM      Action = "delete-vm"
)

// Actions is the closed set of step kinds, in declaration order.
var Actions = []Action{
	ActionCreateOverlay, ActionCreateSeed, ActionDefine, ActionClone, ActionConfigureVM, ActionStart, ActionResume,
	ActionAutostart, ActionWaitAgent, ActionBind, ActionExecBootstrap, ActionExecReady, ActionExecDrain, ActionUnbind,
	ActionStop, ActionUndefine, ActionDeleteVolume, ActionDeleteVM,
}

// destructive are the actions that destroy something a VM had: its power
// state, its definition or its disks. Whether an action destroys is a
// fact about the action, decided here; how the human plan marks it is the
// renderer's business (jsonplan.Glyph).
var destructive = map[Action]bool{
	ActionStop: true, ActionUndefine: true, ActionDeleteVolume: true, ActionDeleteVM: true,
}

// Destructive reports whether the action destroys something; the executor
// re-checks ownership on the live VM right before such a step.
func (a Action) Destructive() bool { return destructive[a] }

// Symbol is the one-character marker of an action in the human plan:
// + create/define/clone, > start, ~ change or exec, - destroy.
func (a Action) Symbol() string { return jsonplan.Glyph(string(a)) }

// Params holds the parameters of exactly one action; the others are nil.
type Params struct {
	Overlay *hypervisors.OverlaySpec
	Seed    *hypervisors.SeedSpec
	Domain  *hypervisors.DomainSpec
	Clone   *hypervisors.CloneSpec
	Size    *hypervisors.SizeSpec
	Marker  *observed.Marker
	// Exec is the argv run in the guest; for exec-bootstrap the blob is
	// written to BlobPath first and removed after (the blob itself is never
	// part of a plan).
	Exec     []string
	BlobPath string
	// Pool and Volume name a volume to delete.
	Pool   string
	Volume string
	// Grace bounds a graceful shutdown before a power-off.
	Grace Duration
	// Autostart value for the autostart step.
	Autostart bool
}

// Duration is a step's time parameter.
type Duration time.Duration

// Step is one ensure-style hypervisor operation.
type Step struct {
	// ID is stable and readable: "<zone>/<vm>/<action>[:<detail>]".
	ID        string
	Action    Action
	Target    hypervisors.Target
	DependsOn []string
	Params    Params
	// Reason is for people and metrics ("intent:create", "drift:stopped",
	// "missing"); the executor never branches on it.
	Reason string
}

// DriftKind classifies a difference between desired and observed.
type DriftKind string

const (
	DriftMissing       DriftKind = "missing"
	DriftStopped       DriftKind = "stopped"
	DriftPaused        DriftKind = "paused"
	DriftResized       DriftKind = "resized"
	DriftOrphan        DriftKind = "orphan"
	DriftNameCollision DriftKind = "unmanaged-name-collision"
	DriftUnknownHost   DriftKind = "unknown-host"
	DriftLeaked        DriftKind = "leaked"
	// DriftSeedMismatch: a libvirt seed volume does not carry the content
	// identity of the seed the machine needs (repaired by rebuilding it).
	DriftSeedMismatch DriftKind = "seed-mismatch"
)

// DriftKinds lists every kind, for metrics that must report zeros.
var DriftKinds = []DriftKind{DriftMissing, DriftStopped, DriftPaused, DriftResized, DriftOrphan, DriftNameCollision, DriftUnknownHost, DriftLeaked, DriftSeedMismatch}

// Policy says what the reconciler does about a drift.
type Policy string

const (
	PolicyRepair Policy = "repair" // steps in this plan fix it
	PolicyReport Policy = "report" // reported only
	PolicyFail   Policy = "fail"   // the machine goes FAILED with last_error
	PolicyAdopt  Policy = "adopt"  // the VM is adopted into the inventory
)

// Drift is one finding.
type Drift struct {
	Machine string
	Zone    string
	VM      string
	Kind    DriftKind
	Policy  Policy
	Detail  string
}

// Intent summarises the transition a machine change serves.
type Intent struct {
	Kind    string
	OpID    string
	Cluster string
	Grace   int64
}

// Adopt asks the reconciler to record an owned VM for a machine.
type Adopt struct {
	Host         string
	VMName       string
	VMID         int
	Cluster      string
	InstanceType string
}

// Change is everything planned for one machine.
type Change struct {
	Machine string
	Zone    string
	State   string
	Intent  *Intent
	// VM is the VM the change works on and, for a Create, settles the
	// machine on (its VMID is 0 until a clone step allocates one).
	VM    *hypervisors.Target
	Steps []Step
	// Finish is the state the machine settles in once every step has
	// succeeded (empty: the steps repair drift only).
	Finish string
	// Fail, when set, is the last_error the machine is failed with.
	Fail  string
	Adopt *Adopt
	// Wait says why nothing can be done now (e.g. the host is unknown).
	Wait string
}

// Empty reports whether the change does nothing.
func (c *Change) Empty() bool {
	return len(c.Steps) == 0 && c.Finish == "" && c.Fail == "" && c.Adopt == nil
}

// Summary counts a plan's changes the way the human plan prints them.
type Summary struct {
	Create    int
	Configure int
	Drain     int
	Delete    int
	Repair    int
	Fail      int
	Adopt     int
	Drift     int
	Steps     int
}

// Plan is the output of one planning pass: data, not behaviour.
// Its published form is jsonplan.Plan (see JSON).
type Plan struct {
	Hypervisor   string
	Installation string
	Lineage      string
	Serial       uint64
	ObservedAt   time.Time
	PlannedAt    time.Time
	Zones        []Zone
	Changes      []Change
	Drift        []Drift
	Summary      Summary
}

// Zone is a zone's observation status as the plan saw it.
type Zone struct {
	Name   string
	Status string
	Error  string
}

// HasChanges reports whether applying the plan would do anything.
func (p *Plan) HasChanges() bool {
	for i := range p.Changes {
		if !p.Changes[i].Empty() {
			return true
		}
	}
	return false
}
