package planner

import (
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/observed"
)

// FormatVersion is the version of the JSON plan; it changes only when a
// consumer would have to change.
const FormatVersion = "1.0"

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

// Symbol is the one-character marker of an action in the human plan:
// + create/define/clone, > start, ~ change or exec, - destroy.
func (a Action) Symbol() string {
	switch a {
	case ActionCreateOverlay, ActionCreateSeed, ActionDefine, ActionClone:
		return "+"
	case ActionStart, ActionResume:
		return ">"
	case ActionStop, ActionUndefine, ActionDeleteVolume, ActionDeleteVM:
		return "-"
	default:
		return "~"
	}
}

// Destructive reports whether the action destroys something; the executor
// re-checks ownership on the live VM right before such a step.
func (a Action) Destructive() bool { return a.Symbol() == "-" }

// Params holds the parameters of exactly one action; the others are nil.
type Params struct {
	Overlay *hypervisors.OverlaySpec `json:"overlay,omitempty"`
	Seed    *hypervisors.SeedSpec    `json:"seed,omitempty"`
	Domain  *hypervisors.DomainSpec  `json:"domain,omitempty"`
	Clone   *hypervisors.CloneSpec   `json:"clone,omitempty"`
	Size    *hypervisors.SizeSpec    `json:"size,omitempty"`
	Marker  *observed.Marker         `json:"marker,omitempty"`
	// Exec is the argv run in the guest; for exec-bootstrap the blob is
	// written to BlobPath first and removed after (the blob itself is never
	// part of a plan).
	Exec     []string `json:"exec,omitempty"`
	BlobPath string   `json:"blob_path,omitempty"`
	// Pool and Volume name a volume to delete.
	Pool   string `json:"pool,omitempty"`
	Volume string `json:"volume,omitempty"`
	// Grace bounds a graceful shutdown before a power-off.
	Grace Duration `json:"grace,omitempty"`
	// Autostart value for the autostart step.
	Autostart bool `json:"autostart,omitempty"`
}

// Duration marshals as a Go duration string.
type Duration time.Duration

func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	*d = Duration(v)
	return err
}

// Step is one ensure-style hypervisor operation.
type Step struct {
	// ID is stable and readable: "<zone>/<vm>/<action>[:<detail>]".
	ID        string             `json:"id"`
	Action    Action             `json:"action"`
	Target    hypervisors.Target `json:"target"`
	DependsOn []string           `json:"depends_on,omitempty"`
	Params    Params             `json:"params"`
	// Reason is for people and metrics ("intent:create", "drift:stopped",
	// "missing"); the executor never branches on it.
	Reason string `json:"reason"`
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

// DriftKinds lists every kind, for metrics that must report zeros.
var DriftKinds = []DriftKind{DriftMissing, DriftStopped, DriftPaused, DriftResized, DriftOrphan, DriftNameCollision, DriftUnknownHost, DriftLeaked}

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
	Machine string    `json:"machine,omitempty"`
	Zone    string    `json:"zone"`
	VM      string    `json:"vm,omitempty"`
	Kind    DriftKind `json:"kind"`
	Policy  Policy    `json:"policy"`
	Detail  string    `json:"detail"`
}

// Intent summarises the transition a machine change serves.
type Intent struct {
	Kind    string `json:"kind"`
	OpID    string `json:"op_id"`
	Cluster string `json:"cluster,omitempty"`
	Grace   int64  `json:"grace_seconds,omitempty"`
}

// Adopt asks the reconciler to record an owned VM for a machine.
type Adopt struct {
	Host         string `json:"host"`
	VMName       string `json:"vm_name"`
	VMID         int    `json:"vmid,omitempty"`
	Cluster      string `json:"cluster,omitempty"`
	InstanceType string `json:"instance_type,omitempty"`
}

// Change is everything planned for one machine.
type Change struct {
	Machine string  `json:"machine"`
	Zone    string  `json:"zone"`
	State   string  `json:"state"`
	Intent  *Intent `json:"intent,omitempty"`
	// VM is the VM the change works on and, for a Create, settles the
	// machine on (its VMID is 0 until a clone step allocates one).
	VM    *hypervisors.Target `json:"vm,omitempty"`
	Steps []Step              `json:"steps,omitempty"`
	// Finish is the state the machine settles in once every step has
	// succeeded (empty: the steps repair drift only).
	Finish string `json:"finish,omitempty"`
	// Fail, when set, is the last_error the machine is failed with.
	Fail  string `json:"fail,omitempty"`
	Adopt *Adopt `json:"adopt,omitempty"`
	// Wait says why nothing can be done now (e.g. the host is unknown).
	Wait string `json:"wait,omitempty"`
}

// Empty reports whether the change does nothing.
func (c *Change) Empty() bool {
	return len(c.Steps) == 0 && c.Finish == "" && c.Fail == "" && c.Adopt == nil
}

// Summary counts a plan's changes the way the human plan prints them.
type Summary struct {
	Create    int `json:"create"`
	Configure int `json:"configure"`
	Drain     int `json:"drain"`
	Delete    int `json:"delete"`
	Repair    int `json:"repair"`
	Fail      int `json:"fail"`
	Adopt     int `json:"adopt"`
	Drift     int `json:"drift"`
	Steps     int `json:"steps"`
}

// Plan is the output of one planning pass: data, not behaviour.
type Plan struct {
	FormatVersion string    `json:"format_version"`
	Hypervisor    string    `json:"hypervisor"`
	Installation  string    `json:"installation"`
	Lineage       string    `json:"lineage"`
	Serial        uint64    `json:"serial"`
	ObservedAt    time.Time `json:"observed_at"`
	PlannedAt     time.Time `json:"planned_at"`
	Zones         []Zone    `json:"zones"`
	Changes       []Change  `json:"changes"`
	Drift         []Drift   `json:"drift"`
	Summary       Summary   `json:"summary"`
}

// Zone is a zone's observation status as the plan saw it.
type Zone struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
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
