package reconciler

import (
	"slices"
	"sync"
	"time"

	"github.com/bigfleet-vm/provider/planner"
)

// tally keeps what each machine contributes to the published plan totals
// (its drift and pending steps, as its newest plan found them) and
// publishes a fresh, immutable planner.Totals whenever a contribution
// changes: a full pass replaces them all, a machine's reconcile replaces
// its own. So the drift and pending-step gauges follow each reconcile
// instead of waiting for the next full pass, and a reader never sees a
// half-updated set.
//
// Each contribution is dated by the time its information holds from (the
// observation it was planned from, or the end of the steps that changed
// it), and an older one never replaces a newer one: a full pass that
// observed a VM before a repair started it does not bring its drift back.
// Memory: one entry per machine with drift or steps, plus the zone-level
// findings, plus one per machine reconciled since the last full pass.
type tally struct {
	publish func(*planner.Totals)
	actions []planner.Action
	kinds   []planner.DriftKind

	mu        sync.Mutex
	by        map[string]dated
	drift     map[planner.DriftKey]int
	pending   map[planner.Action]int
	steps     int
	zones     []string
	plannedAt time.Time
}

type dated struct {
	at time.Time
	c  planner.Contribution
}

func newTally(publish func(*planner.Totals), actions []planner.Action, kinds []planner.DriftKind) *tally {
	return &tally{publish: publish, actions: actions, kinds: kinds, by: map[string]dated{}, drift: map[planner.DriftKey]int{}, pending: map[planner.Action]int{}}
}

// full replaces every contribution with a full plan's, observed at at,
// except those newer than it.
func (t *tally) full(p *planner.Plan, at time.Time) {
	if t.publish == nil {
		return
	}
	next := planner.Contributions(p)
	t.mu.Lock()
	defer t.mu.Unlock()
	by := make(map[string]dated, len(next))
	for id, c := range next {
		by[id] = dated{at: at, c: c}
	}
	for id, d := range t.by {
		if d.at.After(at) {
			by[id] = d // newer than the pass (or a tombstone of it)
		}
	}
	t.by = by
	t.drift, t.pending, t.steps = map[planner.DriftKey]int{}, map[planner.Action]int{}, 0
	for _, d := range by {
		t.add(d.c, 1)
	}
	t.zones = make([]string, 0, len(p.Zones))
	for _, z := range p.Zones {
		t.zones = append(t.zones, z.Name)
	}
	t.plannedAt = p.PlannedAt
	t.publishLocked()
}

// machine replaces one machine's contribution with c, true from at on.
func (t *tally) machine(id string, at time.Time, c planner.Contribution) {
	if t.publish == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old, ok := t.by[id]
	if ok && old.at.After(at) {
		return
	}
	// An empty contribution stays as a dated tombstone until the next
	// full pass newer than it, so an older pass cannot bring back what it
	// cleared.
	t.by[id] = dated{at: at, c: c}
	if ok && slices.Equal(old.c.Drift, c.Drift) && slices.Equal(old.c.Steps, c.Steps) {
		return
	}
	if !ok && len(c.Drift) == 0 && len(c.Steps) == 0 {
		return
	}
	if ok {
		t.add(old.c, -1)
	}
	t.add(c, 1)
	t.publishLocked()
}

func (t *tally) add(c planner.Contribution, sign int) {
	for _, k := range c.Drift {
		if t.drift[k] += sign; t.drift[k] == 0 {
			delete(t.drift, k)
		}
	}
	for _, a := range c.Steps {
		if t.pending[a] += sign; t.pending[a] == 0 {
			delete(t.pending, a)
		}
	}
	t.steps += sign * len(c.Steps)
}

// publishLocked hands out a copy: the published Totals is never written
// again.
func (t *tally) publishLocked() {
	out := &planner.Totals{PlannedAt: t.plannedAt, Zones: slices.Clone(t.zones), Steps: t.steps, Actions: t.actions, DriftKinds: t.kinds,
		Drift: make(map[planner.DriftKey]int, len(t.drift)), Pending: make(map[planner.Action]int, len(t.pending))}
	for k, n := range t.drift {
		out.Drift[k] = n
	}
	for a, n := range t.pending {
		out.Pending[a] = n
	}
	t.publish(out)
}
