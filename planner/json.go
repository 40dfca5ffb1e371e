package planner

import (
	"io"
	"slices"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/jsonplan"
)

// TextOptions shape the human plan.
type TextOptions = jsonplan.TextOptions

// MarshalJSON renders a plan as the versioned, indented JSON that
// `provider plan --json` prints and /debug/plan serves.
func MarshalJSON(p *Plan) ([]byte, error) { return jsonplan.Marshal(p.JSON()) }

// WriteText renders a plan as text the only way it is ever rendered: it
// marshals the plan to its JSON form and renders that, so the human plan
// can never show something the JSON plan does not carry.
func WriteText(w io.Writer, p *Plan, opts TextOptions) error {
	b, err := MarshalJSON(p)
	if err != nil {
		return err
	}
	return jsonplan.RenderText(w, b, opts)
}

// JSON converts the plan to its published form, field by field: a field
// the planner or an adapter's spec gains reaches the JSON plan only when
// it is added here and to jsonplan (with a format_version bump).
func (p *Plan) JSON() *jsonplan.Plan {
	out := &jsonplan.Plan{
		Hypervisor:   p.Hypervisor,
		Installation: p.Installation,
		Lineage:      p.Lineage,
		Serial:       p.Serial,
		ObservedAt:   p.ObservedAt,
		PlannedAt:    p.PlannedAt,
		Zones:        make([]jsonplan.Zone, 0, len(p.Zones)),
		Changes:      make([]jsonplan.Change, 0, len(p.Changes)),
		Drift:        make([]jsonplan.Drift, 0, len(p.Drift)),
		Summary:      jsonplan.Summary(p.Summary),
	}
	for _, z := range p.Zones {
		out.Zones = append(out.Zones, jsonplan.Zone(z))
	}
	for i := range p.Changes {
		out.Changes = append(out.Changes, p.Changes[i].json())
	}
	for _, d := range p.Drift {
		out.Drift = append(out.Drift, jsonplan.Drift{Machine: d.Machine, Zone: d.Zone, VM: d.VM, Kind: string(d.Kind),
			Policy: string(d.Policy), Detail: d.Detail})
	}
	out.FormatVersion = jsonplan.VersionFor(out)
	return out
}

func (c *Change) json() jsonplan.Change {
	out := jsonplan.Change{Machine: c.Machine, Zone: c.Zone, State: c.State, Finish: c.Finish, Fail: c.Fail, Wait: c.Wait}
	if c.Intent != nil {
		in := jsonplan.Intent(*c.Intent)
		out.Intent = &in
	}
	if c.VM != nil {
		t := target(*c.VM)
		out.VM = &t
	}
	if c.Adopt != nil {
		a := jsonplan.Adopt(*c.Adopt)
		out.Adopt = &a
	}
	for i := range c.Steps {
		s := &c.Steps[i]
		out.Steps = append(out.Steps, jsonplan.Step{ID: s.ID, Action: string(s.Action), Target: target(s.Target),
			DependsOn: slices.Clone(s.DependsOn), Params: s.Params.json(), Reason: s.Reason})
	}
	return out
}

func (p *Params) json() jsonplan.Params {
	out := jsonplan.Params{Exec: slices.Clone(p.Exec), BlobPath: p.BlobPath}
	if p.Grace != 0 {
		out.Grace = time.Duration(p.Grace).String()
	}
	if p.Plugin != nil {
		p.Plugin.PlanJSON(&out)
		if out.Ext != nil {
			// The effect is the step's ActionInfo's: said once, by Info.
			out.Ext.Effect = string(p.Plugin.Info().Effect)
		}
	}
	if p.Marker != nil {
		m := hypervisors.JSONMarker(*p.Marker)
		out.Marker = &m
	}
	return out
}

func target(t hypervisors.Target) jsonplan.Target {
	return jsonplan.Target{Zone: t.Zone, Name: t.Name, VMID: t.VMID}
}
