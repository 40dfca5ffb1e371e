package metrics

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/capacity"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/planner"
)

// termFamilies are the series only the serving replica exports.
var termFamilies = []string{"bigfleet_provider_drift", "bigfleet_provider_plan_pending_steps", "bigfleet_provider_plan_steps",
	"bigfleet_provider_plan_last_timestamp_seconds", "bigfleet_provider_zone_last_observed_timestamp_seconds",
	"bigfleet_provider_zone_up", "bigfleet_provider_machines", "bigfleet_provider_zone_capacity", "bigfleet_provider_zone_offered",
	"bigfleet_provider_zone_running", "bigfleet_provider_zone_overcommit_ratio"}

// families gathers m and returns the names of the families with samples.
func families(t *testing.T, m *Metrics) map[string]bool {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, mf := range mfs {
		if len(mf.GetMetric()) > 0 {
			out[mf.GetName()] = true
		}
	}
	return out
}

// Only the term Serve names, while its guard holds, exports the zone,
// drift, plan, observation and machine series; the serving gauge says
// which replica that is (issue 18: a deposed leader kept exporting frozen
// zone series, so ObservationStale fired after every fail-over).
func TestOnlyTheServingTermExports(t *testing.T) {
	m := New(func() map[[3]string]int { return map[[3]string]int{{"IDLE", "a", "kvm.small"}: 2} }, nil)
	m.SetProvider("libvirt-dc1")
	var ended atomic.Bool
	tm := m.NewTerm(func() error {
		if ended.Load() {
			return errors.New("lease ran out")
		}
		return nil
	})
	tm.ZoneObserved("a", true, time.Unix(1000, 0))
	tm.ZoneCapacity([]capacity.Zone{{Zone: "a", Host: hypervisors.HostCapacity{CPUs: 4, MemoryBytes: 8 << 30},
		Offered: capacity.Usage{VCPU: 8, MemoryBytes: 4 << 30}, Running: capacity.Usage{VCPU: 2, MemoryBytes: 1 << 30}}})
	tm.PlanTotals(&planner.Totals{PlannedAt: time.Unix(1000, 0), Zones: []string{"a"},
		DriftKinds: []planner.DriftKind{planner.DriftStopped, "plugin-kind"},
		Drift:      map[planner.DriftKey]int{{Zone: "a", Kind: planner.DriftStopped}: 1, {Zone: "b", Kind: planner.DriftPaused}: 2},
		Pending:    map[planner.Action]int{planner.ActionStart: 1}, Steps: 1})
	serving := func() map[string]float64 {
		return series(t, m, "bigfleet_provider_serving", func(l map[string]string) string { return l["provider"] })
	}
	check := func(what string, wantServing float64, wantTerm bool) {
		t.Helper()
		if d := cmp.Diff(map[string]float64{"libvirt-dc1": wantServing}, serving()); d != "" {
			t.Errorf("%s: serving (-want +got):\n%s", what, d)
		}
		got := families(t, m)
		for _, f := range termFamilies {
			if got[f] != wantTerm {
				t.Errorf("%s: %s exported %t, want %t", what, f, got[f], wantTerm)
			}
		}
	}
	check("standby before any term", 0, false)
	m.Serve(tm)
	check("serving", 1, true)
	// Each zone reports each kind the plans may use, a plug-in's and
	// zeros included, and any other finding as it is.
	drift := series(t, m, "bigfleet_provider_drift", func(l map[string]string) string { return l["zone"] + "/" + l["kind"] })
	if d := cmp.Diff(map[string]float64{"a/stopped": 1, "a/plugin-kind": 0, "b/paused": 2}, drift); d != "" {
		t.Errorf("drift (-want +got):\n%s", d)
	}
	ratio := series(t, m, "bigfleet_provider_zone_overcommit_ratio", func(l map[string]string) string { return l["zone"] + "/" + l["resource"] })
	if d := cmp.Diff(map[string]float64{"a/cpu": 2, "a/memory": 0.5}, ratio); d != "" {
		t.Errorf("overcommit ratio (-want +got):\n%s", d)
	}
	ended.Store(true)
	check("lease ran out, timers not yet noticed", 0, false)
	ended.Store(false)
	m.Serve(nil)
	check("stepped down", 0, false)
	// A new term starts empty: nothing of the old one leaks into it.
	m.Serve(m.NewTerm(nil))
	if got := families(t, m); got["bigfleet_provider_zone_last_observed_timestamp_seconds"] || got["bigfleet_provider_drift"] || got["bigfleet_provider_zone_capacity"] {
		t.Errorf("a new term exports what an old one observed: %v", got)
	}
}

// Every scrape reads the plan families from one published Totals, never
// a mix of two or a half-built one: scrapes race with publications that
// alternate between two totals whose every value differs, and each
// scrape must equal one of them exactly.
func TestPlanFamiliesFromOneSnapshot(t *testing.T) {
	m := New(nil, nil)
	tm := m.NewTerm(nil)
	m.Serve(tm)
	mk := func(n int) *planner.Totals {
		return &planner.Totals{PlannedAt: time.Unix(int64(n), 0), Zones: []string{"a", "b"},
			Drift:   map[planner.DriftKey]int{{Zone: "a", Kind: planner.DriftStopped}: n, {Zone: "b", Kind: planner.DriftPaused}: n},
			Pending: map[planner.Action]int{planner.ActionStart: n, planner.ActionResume: n}, Steps: 2 * n}
	}
	want := func(n int) string {
		return fmt.Sprintf("drift a/stopped=%d b/paused=%d pending start=%d resume=%d steps=%d at=%d", n, n, n, n, 2*n, n)
	}
	read := func() string {
		mfs, err := m.Registry.Gather() // one scrape
		if err != nil {
			t.Fatal(err)
		}
		v := map[string]float64{}
		for _, mf := range mfs {
			for _, mt := range mf.GetMetric() {
				k := mf.GetName()
				for _, l := range mt.GetLabel() {
					k += "/" + l.GetValue()
				}
				v[k] = mt.GetGauge().GetValue()
			}
		}
		return fmt.Sprintf("drift a/stopped=%v b/paused=%v pending start=%v resume=%v steps=%v at=%v",
			v["bigfleet_provider_drift/stopped/a"], v["bigfleet_provider_drift/paused/b"],
			v["bigfleet_provider_plan_pending_steps/start"], v["bigfleet_provider_plan_pending_steps/resume"],
			v["bigfleet_provider_plan_steps"], v["bigfleet_provider_plan_last_timestamp_seconds"])
	}
	tm.PlanTotals(mk(1))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			tm.PlanTotals(mk(1 + i%2))
		}
	}()
	const n = 1000
	bad := 0
	for i := 0; i < n; i++ {
		if got := read(); got != want(1) && got != want(2) {
			if bad++; bad <= 3 {
				t.Errorf("scrape %d read a mix: %s", i, got)
			}
		}
	}
	close(stop)
	wg.Wait()
	if bad > 0 {
		t.Errorf("%d of %d scrapes inconsistent", bad, n)
	}
}
