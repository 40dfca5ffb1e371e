package contract

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
	"github.com/bigfleet-vm/provider/jsonplan"
)

// testPlanAndDriftBlackBox induces drift through the simulator's admin
// endpoints of a running provider and checks `provider plan` (offline and
// live, text and JSON, exit codes) and the drift gauges on /metrics.
func testPlanAndDriftBlackBox(t *testing.T, h Harness) {
	state := filepath.Join(t.TempDir(), "state")
	common := append(slices.Clone(h.Args), "--seed-count", "8", "--state", state)
	s := h.start(t, "--seed-count", "8", "--state", state, "--fake-latency", "300ms", "--reconcile-interval", "0", "--fake-admin")
	// a and pending in one zone (za), b in another (zb): the default
	// offerings spread the slots over the simulator's two zones.
	var a, b, pending, za, zb string
	for _, m := range providertest.ListAll(t, s.c, providertest.StSpeculative) {
		switch {
		case a == "":
			a, za = m.Id, m.Zone
		case b == "" && m.Zone != za:
			b, zb = m.Id, m.Zone
		case pending == "" && m.Zone == za:
			pending = m.Id
		}
	}
	if b == "" || pending == "" {
		t.Fatalf("want two machines in one zone and one in another: %q %q in %q, %q in %q", a, pending, za, b, zb)
	}
	toIdle(t, s.c, a)
	toIdle(t, s.c, b)

	// A pending Create: the offline plan shows its steps and exits 2.
	providertest.Must(t, "create")(create(s.c, t, pending, tok{}))
	out, code := h.runRaw(t, append([]string{"plan", "--detailed-exitcode", "--no-color"}, common...)...)
	if code != 2 || !strings.Contains(out, "Create op-") || !strings.Contains(out, pending) || !strings.Contains(out, "to create") {
		t.Fatalf("offline plan with a pending create: exit %d\n%s", code, out)
	}
	providertest.WaitState(t, s.c, pending, pb.MachineState_MACHINE_STATE_IDLE, pollDeadline)

	// Report-only drift: a resized VM stays in the plan and on /metrics.
	s.Admin("resize?machine=" + a + "&vcpu=9&memory_mib=1536")
	// An unreachable host: unknown, never empty.
	s.Admin("unreachable?zone=" + zb + "&on=true")
	live := func() *jsonplan.Plan {
		out, code := h.runRaw(t, "plan", "--server", s.MetricsURL(), "--json", "--detailed-exitcode")
		if code == 1 {
			t.Fatalf("live plan failed:\n%s", out)
		}
		p, err := jsonplan.Decode([]byte(out)) // refuses a plan without format_version
		if err != nil {
			t.Fatalf("live plan JSON: %v\n%s", err, out)
		}
		return p
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		p := live()
		if providertest.HasDrift(p, za, "resized") && providertest.HasDrift(p, zb, "unknown-host") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("live plan never showed resized + unknown-host drift: %+v", p.Drift)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The gauges follow the loop's own passes (the admin calls triggered
	// one), not the reads above.
	waitMetricEquals(t, s, "bigfleet_provider_drift", 1, `zone="`+za+`"`, `kind="resized"`)
	waitMetricEquals(t, s, "bigfleet_provider_drift", 1, `zone="`+zb+`"`, `kind="unknown-host"`)
	waitMetricEquals(t, s, "bigfleet_provider_zone_up", 0, `zone="`+zb+`"`)
	// Offline, the persisted world still shows the resize (report-only,
	// so no changes: exit 0), in text and JSON.
	out, code = h.runRaw(t, append([]string{"plan", "--detailed-exitcode", "--no-color"}, common...)...)
	if code != 0 || !strings.Contains(out, "resized") {
		t.Errorf("offline plan with report-only drift: exit %d\n%s", code, out)
	}
	out, _ = h.runRaw(t, append([]string{"plan", "--json"}, common...)...)
	if off, err := jsonplan.Decode([]byte(out)); err != nil || !providertest.HasDrift(off, za, "resized") {
		t.Errorf("offline JSON plan: %v\n%s", err, out)
	}

	// A stopped VM is repaired (started again), the machine stays IDLE.
	s.Admin("unreachable?zone=" + zb + "&on=false")
	s.Admin("stop?machine=" + b)
	waitMetric(t, s, "bigfleet_provider_executor_steps_total", 1, `action="start"`, `outcome="ok"`)
	if st := providertest.Get(t, s.c, b).State; st != pb.MachineState_MACHINE_STATE_IDLE {
		t.Errorf("repaired machine is %v", st)
	}

	// A vanished VM of an IDLE machine is surfaced as FAILED, never
	// silently recreated.
	s.Admin("delete?machine=" + a)
	m := providertest.WaitState(t, s.c, a, pb.MachineState_MACHINE_STATE_FAILED, pollDeadline)
	if !strings.Contains(m.LastError, "vanished") {
		t.Errorf("last_error %q", m.LastError)
	}
}

// waitMetricEquals waits until the metric's value is want.
func waitMetricEquals(t *testing.T, s *server, name string, want float64, labels ...string) {
	t.Helper()
	providertest.WaitMetric(t, fmt.Sprint(name, labels), func() float64 { return s.Metric(name, labels...) },
		func(v float64) bool { return v == want }, 20*time.Second)
}

func waitMetric(t *testing.T, s *server, name string, min float64, labels ...string) {
	t.Helper()
	providertest.WaitMetric(t, fmt.Sprint(name, labels), func() float64 { return s.Metric(name, labels...) },
		func(v float64) bool { return v >= min }, 20*time.Second)
}
