package reconciler

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/executor"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/libvirtsim"
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
	"github.com/bigfleet-vm/provider/planner"
)

// sink is a Metrics that remembers what the loop published.
type sink struct {
	mu       sync.Mutex
	totals   []*planner.Totals
	observed int
	full     int
	repairs  map[string]int
}

func (s *sink) Reconciled(outcome string, _ time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if outcome == "full" {
		s.full++
	}
}

func (s *sink) PlanTotals(t *planner.Totals) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.totals = append(s.totals, t)
}

func (s *sink) ZoneObserved(string, bool, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.observed++
}

func (s *sink) RepairFailed(zone string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.repairs == nil {
		s.repairs = map[string]int{}
	}
	s.repairs[zone]++
}

// stopped is how many stopped findings and pending start steps t counts.
func stopped(t *planner.Totals) [2]int {
	if t == nil {
		return [2]int{-1, -1}
	}
	return [2]int{t.Drift[planner.DriftKey{Zone: "z1", Kind: planner.DriftStopped}], t.Pending[planner.ActionStart]}
}

// await waits until ok holds of the newest totals and returns them with
// the number of zone observations full passes had made by then. A full
// pass observes before it publishes its totals but counts itself
// (Reconciled "full") only after, so the observations, not the full
// count, tell whether a publication came from a new full pass.
func (s *sink) await(t *testing.T, what string, ok func(*planner.Totals) bool) (*planner.Totals, int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s.mu.Lock()
		var tot *planner.Totals
		if len(s.totals) > 0 {
			tot = s.totals[len(s.totals)-1]
		}
		observed := s.observed
		s.mu.Unlock()
		if ok(tot) {
			return tot, observed
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: last totals %+v", what, tot)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// The drift and pending-step totals follow the machine's own reconcile: a
// stopped VM found by a full pass is started by its repair, and the
// totals drop to zero at once, with no further full pass (issue 18: they
// stayed at 1 until the next pass, 95 s later).
func TestTotalsFollowTheMachinesReconcile(t *testing.T) {
	s := &sink{}
	r := newRig(t, "libvirt", desired.NewMemoryStore(nil), simcore.Options{}, func(o *Options) {
		o.Metrics, o.Interval = s, 0
		// The repair is held long enough for the pending state to be seen.
		o.RepairDelay = 300 * time.Millisecond
	})
	id := "z1/t/000"
	r.mutate(t, desired.Request{Kind: desired.KindCreate, MachineID: id})
	m := r.await(t, id, desired.Idle)
	if err := r.hv.(*libvirtsim.Libvirt).StopVM(hypervisors.Target{Zone: "z1", Name: m.VMName}); err != nil {
		t.Fatal(err)
	}
	r.rec.Trigger()
	_, obsAtDrift := s.await(t, "the full pass finds the stopped VM", func(t *planner.Totals) bool { return stopped(t) == [2]int{1, 1} })
	_, obsAtRepair := s.await(t, "the repair clears the totals", func(t *planner.Totals) bool { return stopped(t) == [2]int{0, 0} })
	if obsAtRepair != obsAtDrift {
		t.Errorf("the totals were cleared by a full pass (zone observations %d, then %d), not by the machine's reconcile", obsAtDrift, obsAtRepair)
	}
}

// A full pass whose observation predates a machine's newer reconcile does
// not bring back what that reconcile cleared.
func TestTallyKeepsNewerContributions(t *testing.T) {
	var got *planner.Totals
	tl := newTally(func(t *planner.Totals) { got = t }, nil, nil)
	t0 := time.Unix(100, 0)
	stale := &planner.Plan{PlannedAt: t0, Zones: []planner.Zone{{Name: "z1"}},
		Drift:   []planner.Drift{{Machine: "m", Zone: "z1", Kind: planner.DriftStopped}},
		Changes: []planner.Change{{Machine: "m", Steps: []planner.Step{{Action: planner.ActionStart}}}}}
	tl.full(stale, t0)
	if d := cmp.Diff([2]int{1, 1}, [2]int{got.Drift[planner.DriftKey{Zone: "z1", Kind: planner.DriftStopped}], got.Pending[planner.ActionStart]}); d != "" {
		t.Fatalf("after the pass (-want +got):\n%s", d)
	}
	tl.machine("m", t0.Add(2*time.Second), planner.Contribution{}) // repaired
	tl.full(stale, t0.Add(time.Second))                            // a pass that observed before the repair ended
	if got.Drift[planner.DriftKey{Zone: "z1", Kind: planner.DriftStopped}] != 0 || got.Steps != 0 {
		t.Errorf("an older pass brought back cleared drift: %+v", got)
	}
	tl.full(stale, t0.Add(3*time.Second)) // a pass newer than the repair wins
	if got.Steps != 1 {
		t.Errorf("a newer pass was ignored: %+v", got)
	}
}

// Plan is a read: observing and planning for /debug/plan or provider
// plan changes no metric (issue 18: a read-only provider plan --server
// refreshed the drift gauges).
func TestPlanIsARead(t *testing.T) {
	s := &sink{}
	r := newRig(t, "libvirt", desired.NewMemoryStore(nil), simcore.Options{}, func(o *Options) {
		o.Metrics, o.Interval = s, 0
		o.RepairDelay = time.Hour
	})
	id := "z1/t/000"
	r.mutate(t, desired.Request{Kind: desired.KindCreate, MachineID: id})
	m := r.await(t, id, desired.Idle)
	s.await(t, "the first pass", func(t *planner.Totals) bool { return t != nil })
	time.Sleep(50 * time.Millisecond) // let the create's own publications settle
	s.mu.Lock()
	before, observedBefore := len(s.totals), s.observed
	s.mu.Unlock()
	if err := r.hv.(*libvirtsim.Libvirt).StopVM(hypervisors.Target{Zone: "z1", Name: m.VMName}); err != nil {
		t.Fatal(err)
	}
	p := r.rec.Plan(context.Background())
	if len(p.Drift) != 1 {
		t.Fatalf("the plan does not show the stopped VM: %+v", p.Drift)
	}
	s.mu.Lock()
	after, observedAfter := len(s.totals), s.observed
	s.mu.Unlock()
	if after != before || observedAfter != observedBefore {
		t.Errorf("Plan published: totals %d -> %d, zone observations %d -> %d", before, after, observedBefore, observedAfter)
	}
}

// A drift repair whose Start keeps failing retryably ends after its
// attempt budget, or at its deadline, goes back to the queue with backoff,
// and is reported: the repair-failure count, and RepairFailures with the
// machine's last error; a repair that then succeeds clears it (issue 18:
// it retried forever on one worker and never reached the queue's backoff).
func TestRepairBudget(t *testing.T) {
	for _, tc := range []struct {
		name     string
		attempts int
		timeout  time.Duration
	}{
		{"attempts", 3, 0},
		{"deadline", 0, 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &sink{}
			var flapping atomic.Bool
			flapping.Store(true)
			hook := func(_ context.Context, c simcore.Call) error {
				if c.Op == "Start" && flapping.Load() {
					return hypervisors.ErrTransient
				}
				return nil
			}
			r := newRig(t, "libvirt", desired.NewMemoryStore(nil), simcore.Options{}, func(o *Options) {
				o.Metrics, o.Interval = s, 0
				o.RetryMin, o.RetryMax = 10*time.Millisecond, 50*time.Millisecond
				o.RepairTimeout = tc.timeout
				o.Executor = executor.New(executor.Options{Hypervisor: o.Hypervisor, Installation: "inst", Blob: o.Doc.Blob,
					MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, RepairAttempts: tc.attempts})
			})
			id := "z1/t/000"
			r.mutate(t, desired.Request{Kind: desired.KindCreate, MachineID: id})
			m := r.await(t, id, desired.Idle)
			lv := r.hv.(*libvirtsim.Libvirt)
			lv.SetHook(hook)
			if err := lv.StopVM(hypervisors.Target{Zone: "z1", Name: m.VMName}); err != nil {
				t.Fatal(err)
			}
			r.rec.Trigger()
			deadline := time.Now().Add(20 * time.Second)
			for {
				fs := r.rec.RepairFailures()
				s.mu.Lock()
				n := s.repairs["z1"]
				s.mu.Unlock()
				if len(fs) == 1 && fs[0].Failures >= 2 && n >= 2 {
					if fs[0].Machine != id || fs[0].Zone != "z1" || !strings.Contains(fs[0].Error, "start") || fs[0].RetryIn <= 0 {
						t.Errorf("failure %+v", fs[0])
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("repair failures %+v, counted %d; want the machine failing repeatedly", fs, n)
				}
				time.Sleep(5 * time.Millisecond)
			}
			flapping.Store(false)
			deadline = time.Now().Add(20 * time.Second)
			for len(r.rec.RepairFailures()) != 0 {
				if time.Now().After(deadline) {
					t.Fatalf("the repair succeeded but is still reported: %+v", r.rec.RepairFailures())
				}
				time.Sleep(5 * time.Millisecond)
			}
			if vm, err := r.hv.Lookup(context.Background(), hypervisors.Target{Zone: "z1", Name: m.VMName}); err != nil || vm.Power != "running" {
				t.Errorf("VM after the repair: %+v, %v", vm, err)
			}
		})
	}
}
