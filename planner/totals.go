package planner

import "time"

// DriftKey is what the drift gauge counts by.
type DriftKey struct {
	Zone string
	Kind DriftKind
}

// Totals are the counts the metrics publish of the plans: drift findings
// by zone and kind, pending steps by action (every action, zeros
// included), the zones the last full plan
// saw (every kind is reported there, zeros included) and when it was
// planned. A Totals is immutable once published: whoever changes the
// counts builds a new one, so a reader (a scrape) sees one consistent set.
type Totals struct {
	PlannedAt time.Time
	Zones     []string
	Drift     map[DriftKey]int
	Pending   map[Action]int
	// Actions are every action the plans may use (the pending gauge
	// reports each, zeros included).
	Actions []Action
	// DriftKinds are every kind the plans may report (the drift gauge
	// reports each per zone, zeros included).
	DriftKinds []DriftKind
	Steps      int
}

// Contribution is what one machine (or, under the empty id, no machine:
// a zone that cannot be observed) adds to the totals: its drift and the
// actions of its pending steps.
type Contribution struct {
	Drift []DriftKey
	Steps []Action
}

// Contributions splits a plan into what each machine contributes, keyed
// by machine id ("" for findings of no machine).
func Contributions(p *Plan) map[string]Contribution {
	out := make(map[string]Contribution, len(p.Changes))
	for _, d := range p.Drift {
		c := out[d.Machine]
		c.Drift = append(c.Drift, DriftKey{Zone: d.Zone, Kind: d.Kind})
		out[d.Machine] = c
	}
	for _, ch := range p.Changes {
		if len(ch.Steps) == 0 {
			continue
		}
		c := out[ch.Machine]
		for _, s := range ch.Steps {
			c.Steps = append(c.Steps, s.Action)
		}
		out[ch.Machine] = c
	}
	return out
}

// Of is what one machine's change and drift contribute.
func Of(c Change, drift []Drift) Contribution {
	var out Contribution
	if len(c.Steps) > 0 {
		out.Steps = make([]Action, 0, len(c.Steps))
	}
	for _, d := range drift {
		out.Drift = append(out.Drift, DriftKey{Zone: d.Zone, Kind: d.Kind})
	}
	for _, s := range c.Steps {
		out.Steps = append(out.Steps, s.Action)
	}
	return out
}

// Reported is what remains of a machine's contribution once its steps
// have run: only the drift no step repairs (reported-only findings).
func Reported(drift []Drift) Contribution {
	var out Contribution
	for _, d := range drift {
		if d.Policy == PolicyReport {
			out.Drift = append(out.Drift, DriftKey{Zone: d.Zone, Kind: d.Kind})
		}
	}
	return out
}
