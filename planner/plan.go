package planner

import (
	"slices"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/jsonplan"
	"github.com/bigfleet-vm/provider/observed"
)

// Action is a step kind: one of the core actions below, or an action of
// the hypervisor plug-in's vocabulary (Params.Plugin).
type Action string

// The core actions: power, guest agent and binding, the same whichever
// hypervisor runs the VM.
const (
	ActionStart         Action = "start"
	ActionResume        Action = "resume"
	ActionWaitAgent     Action = "wait-agent"
	ActionBind          Action = "bind"
	ActionExecBootstrap Action = "exec-bootstrap"
	ActionExecReady     Action = "exec-ready"
	ActionExecDrain     Action = "exec-drain"
	ActionUnbind        Action = "unbind"
	ActionStop          Action = "stop"
)

// CoreActions describes the core actions. Power and marker changes load
// the host (bounded per zone); waits and guest commands do not. Stop is
// the one core action that destroys, re-checked against the live marker.
var CoreActions = []hypervisors.ActionInfo{
	{Name: string(ActionStart), Effect: hypervisors.EffectStart, Heavy: true, Op: "start"},
	{Name: string(ActionResume), Effect: hypervisors.EffectStart, Heavy: true, Op: "resume"},
	{Name: string(ActionWaitAgent), Effect: hypervisors.EffectChange, Op: "agent_ping"},
	{Name: string(ActionBind), Effect: hypervisors.EffectChange, Heavy: true, Op: "set_marker"},
	{Name: string(ActionExecBootstrap), Effect: hypervisors.EffectChange, Op: "agent_exec"},
	{Name: string(ActionExecReady), Effect: hypervisors.EffectChange, Op: "agent_exec"},
	{Name: string(ActionExecDrain), Effect: hypervisors.EffectChange, Op: "agent_exec"},
	{Name: string(ActionUnbind), Effect: hypervisors.EffectChange, Heavy: true, Op: "set_marker"},
	{Name: string(ActionStop), Effect: hypervisors.EffectDestroy, OwnerCheck: true, Heavy: true, Op: "stop"},
}

var coreInfo = func() map[Action]hypervisors.ActionInfo {
	m := make(map[Action]hypervisors.ActionInfo, len(CoreActions))
	for _, a := range CoreActions {
		m[Action(a.Name)] = a
	}
	return m
}()

// CoreAction is the description of a, when a is a core action.
func CoreAction(a Action) (hypervisors.ActionInfo, bool) {
	i, ok := coreInfo[a]
	return i, ok
}

// Actions lists every action a plug-in's plans use: the core actions,
// then the plug-in's.
func Actions(pl Plugin) []Action {
	out := make([]Action, 0, len(CoreActions)+len(pl.Actions()))
	for _, a := range CoreActions {
		out = append(out, Action(a.Name))
	}
	for _, a := range pl.Actions() {
		out = append(out, Action(a.Name))
	}
	return out
}

// Symbol is the one-character marker of an action in the human plan:
// + create/define/clone, > start, ~ change or exec, - destroy.
func (a Action) Symbol() string { return jsonplan.Glyph(string(a)) }

// Params holds a step's parameters: the core actions' fields, or the
// plug-in's typed parameters for a step of its vocabulary.
type Params struct {
	Marker *observed.Marker
	// Exec is the argv run in the guest; for exec-bootstrap the blob is
	// written to BlobPath first and removed after (the blob itself is never
	// part of a plan).
	Exec     []string
	BlobPath string
	// Grace bounds a graceful shutdown before a power-off.
	Grace Duration
	// Plugin is the parameters of a plug-in step (nil for a core action).
	Plugin hypervisors.StepParams
}

// Duration is a step's time parameter.
type Duration time.Duration

// Info describes the step's action: a core action's, or its plug-in
// parameters'. A step with neither has the zero ActionInfo (heavy and
// guarded: the executor refuses it).
func (s *Step) Info() hypervisors.ActionInfo {
	if s.Params.Plugin != nil {
		return s.Params.Plugin.Info()
	}
	if i, ok := coreInfo[s.Action]; ok {
		return i
	}
	return hypervisors.ActionInfo{Name: string(s.Action), Heavy: true, OwnerCheck: true}
}

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
)

// DriftKinds lists the core's kinds; a plug-in declares its own
// (Plugin.DriftKinds).
var DriftKinds = []DriftKind{DriftMissing, DriftStopped, DriftPaused, DriftResized, DriftOrphan, DriftNameCollision, DriftUnknownHost, DriftLeaked}

// AllDriftKinds are the core's kinds and pl's, for metrics that must
// report zeros.
func AllDriftKinds(pl Plugin) []DriftKind {
	return slices.Concat(DriftKinds, pl.DriftKinds())
}

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
