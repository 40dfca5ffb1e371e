package hypervisors

import (
	"context"

	"github.com/bigfleet-vm/provider/jsonplan"
	"github.com/bigfleet-vm/provider/observed"
)

// Effect is what a step does, as the human plan marks it.
type Effect string

const (
	EffectCreate  Effect = "create"  // +
	EffectStart   Effect = "start"   // >
	EffectChange  Effect = "change"  // ~
	EffectDestroy Effect = "destroy" // -
)

// ActionInfo describes one step action: the facts the executor, metrics
// and the plan renderer need, so none of them asks which hypervisor
// planned it.
type ActionInfo struct {
	// Name is the step's action in plans and metrics
	// (^[a-z][a-z-]{0,31}$).
	Name string
	// Effect is what the step does; EffectDestroy is a step that takes
	// something a VM had (its power state, definition or disks).
	Effect Effect
	// OwnerCheck: the executor re-reads the live marker right before the
	// step and refuses it on a VM this installation does not own.
	OwnerCheck bool
	// Heavy: the step loads the host, so it is bounded per zone.
	Heavy bool
	// Op is the hypervisor_calls_total{op} label of the adapter call.
	Op string
}

// StepParams are the typed parameters of one step of a hypervisor's own
// vocabulary. The core carries them from the planner to Apply without
// looking inside.
type StepParams interface {
	Info() ActionInfo
	// PlanJSON writes the step's published parameters into out: a 1.1
	// action its own fields, a plug-in action params.ext's args (the core
	// fills ext's effect from Info).
	PlanJSON(out *jsonplan.Params)
}

// Applier is the part of a Hypervisor that performs the steps of its own
// vocabulary.
type Applier interface {
	// Apply performs one step (an ensure) and returns the VMID it
	// allocated, if any. Params of another hypervisor are ErrUnsupported.
	Apply(ctx context.Context, t Target, p StepParams) (vmid int, err error)
}

// JSONMarker is m in the published plan's form, for PlanJSON.
func JSONMarker(m observed.Marker) jsonplan.Marker {
	return jsonplan.Marker{Installation: m.Installation, MachineID: m.MachineID, OpID: m.OpID, InstanceType: m.InstanceType,
		Cluster: m.Cluster}
}
