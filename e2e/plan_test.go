package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

type planJSON struct {
	FormatVersion string `json:"format_version"`
	Changes       []struct {
		Machine string `json:"machine"`
		Steps   []struct {
			Action string `json:"action"`
		} `json:"steps"`
	} `json:"changes"`
	Drift []struct {
		Zone, Kind, Machine string
	} `json:"drift"`
}

func (s *server) admin(t *testing.T, query string) {
	t.Helper()
	resp := s.httpPost("/admin/" + query)
	if strings.TrimSpace(resp) != "ok" {
		t.Fatalf("admin %s: %s", query, resp)
	}
}

func hasDrift(p planJSON, zone, kind string) bool {
	for _, d := range p.Drift {
		if d.Zone == zone && d.Kind == kind {
			return true
		}
	}
	return false
}

// TestPlanAndDriftBlackBox induces drift through the simulator's admin
// endpoints of a running provider and checks `provider plan` (offline and
// live, text and JSON, exit codes) and the drift gauges on /metrics.
func TestPlanAndDriftBlackBox(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	common := []string{"--use-fake-backend", "--seed-count", "8", "--state", state}
	s := start(t, "--seed-count", "8", "--state", state, "--fake-latency", "300ms", "--reconcile-interval", "0", "--fake-admin")
	ids := speculative(t, s.c, 8)
	var a, b string
	for _, id := range ids {
		switch {
		case a == "" && strings.HasPrefix(id, "local-a/"):
			a = id
		case b == "" && strings.HasPrefix(id, "local-b/"):
			b = id
		}
	}
	toIdle(t, s.c, a)
	toIdle(t, s.c, b)

	// A pending Create: the offline plan shows its steps and exits 2.
	var pending string
	for _, id := range ids {
		if id != a && id != b && strings.HasPrefix(id, "local-a/") {
			pending = id
			break
		}
	}
	providertest.Must(t, "create")(create(s.c, t, pending, tok{}))
	out, code := runRaw(t, append([]string{"plan", "--detailed-exitcode", "--no-color"}, common...)...)
	if code != 2 || !strings.Contains(out, "Create op-") || !strings.Contains(out, pending) || !strings.Contains(out, "to create") {
		t.Fatalf("offline plan with a pending create: exit %d\n%s", code, out)
	}
	providertest.WaitState(t, s.c, pending, pb.MachineState_MACHINE_STATE_IDLE, pollDeadline)

	// Report-only drift: a resized VM stays in the plan and on /metrics.
	s.admin(t, "resize?machine="+a+"&vcpu=9&memory_mib=1536")
	// An unreachable host: unknown, never empty.
	s.admin(t, "unreachable?zone=local-b&on=true")
	live := func() planJSON {
		out, code := runRaw(t, "plan", "--server", s.MetricsURL(), "--json", "--detailed-exitcode")
		if code == 1 {
			t.Fatalf("live plan failed:\n%s", out)
		}
		var p planJSON
		if err := json.Unmarshal([]byte(out), &p); err != nil {
			t.Fatalf("live plan JSON: %v\n%s", err, out)
		}
		if p.FormatVersion == "" {
			t.Fatalf("plan without format_version:\n%s", out)
		}
		return p
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		p := live()
		if hasDrift(p, "local-a", "resized") && hasDrift(p, "local-b", "unknown-host") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("live plan never showed resized + unknown-host drift: %+v", p.Drift)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The gauges follow the loop's own passes (the admin calls triggered
	// one), not the reads above.
	waitMetricEquals(t, s, "bigfleet_provider_drift", 1, `zone="local-a"`, `kind="resized"`)
	waitMetricEquals(t, s, "bigfleet_provider_drift", 1, `zone="local-b"`, `kind="unknown-host"`)
	waitMetricEquals(t, s, "bigfleet_provider_zone_up", 0, `zone="local-b"`)
	// Offline, the persisted world still shows the resize (report-only,
	// so no changes: exit 0), in text and JSON.
	out, code = runRaw(t, append([]string{"plan", "--detailed-exitcode", "--no-color"}, common...)...)
	if code != 0 || !strings.Contains(out, "resized") {
		t.Errorf("offline plan with report-only drift: exit %d\n%s", code, out)
	}
	out, _ = runRaw(t, append([]string{"plan", "--json"}, common...)...)
	var off planJSON
	if err := json.Unmarshal([]byte(out), &off); err != nil || !hasDrift(off, "local-a", "resized") {
		t.Errorf("offline JSON plan: %v\n%s", err, out)
	}

	// A stopped VM is repaired (started again), the machine stays IDLE.
	s.admin(t, "unreachable?zone=local-b&on=false")
	s.admin(t, "stop?machine="+b)
	waitMetric(t, s, "bigfleet_provider_executor_steps_total", 1, `action="start"`, `outcome="ok"`)
	if st := providertest.Get(t, s.c, b).State; st != pb.MachineState_MACHINE_STATE_IDLE {
		t.Errorf("repaired machine is %v", st)
	}

	// A vanished VM of an IDLE machine is surfaced as FAILED, never
	// silently recreated.
	s.admin(t, "delete?machine="+a)
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

// httpPost posts to a path on the metrics listener and returns the body.
func (s *server) httpPost(path string) string {
	s.T().Helper()
	resp, err := http.Post(s.MetricsURL()+path, "text/plain", nil)
	if err != nil {
		s.T().Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestAdminAnswersOnceDurable: the simulator journals its world lazily,
// so an admin change must be durable before the endpoint answers, as a
// hypervisor's own API would be. A kill -9 right after the answer keeps
// it: the offline plan of the state still shows the resize.
func TestAdminAnswersOnceDurable(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	s := start(t, "--seed-count", "4", "--state", state, "--reconcile-interval", "0", "--fake-admin")
	id := speculative(t, s.c, 1)[0]
	toIdle(t, s.c, id)
	s.admin(t, "resize?machine="+id+"&vcpu=9&memory_mib=1536")
	s.Kill()
	out, _ := runRaw(t, "plan", "--json", "--use-fake-backend", "--seed-count", "4", "--state", state)
	var p planJSON
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("offline JSON plan: %v\n%s", err, out)
	}
	zone := strings.SplitN(id, "/", 2)[0]
	if !hasDrift(p, zone, "resized") {
		t.Errorf("after kill -9 right after the admin answer, the resize is lost: drift %+v", p.Drift)
	}
}

// TestPlanTextEscapesClientStrings (issue 17, item 4): a client's
// cluster_id with terminal escapes (a screen clear, colours, a forged plan
// line) reaches `provider plan` text escaped, never as control bytes,
// and so does every log line of the text log; the JSON plan keeps the
// exact string.
func TestPlanTextEscapesClientStrings(t *testing.T) {
	const evil = "c1\x1b[2J\x1b[H\r\nPlan: 0 to create, 0 to configure, 0 to drain, 0 to delete; 0 drift.\x1b[8m\u202e"
	state := filepath.Join(t.TempDir(), "state")
	s := start(t, "--seed-count", "2", "--state", state, "--log-level", "debug", "--log-format", "text", "--fake-latency", "300ms")
	id := speculative(t, s.c, 1)[0]
	toIdle(t, s.c, id)
	// A refused call is logged with the machine id the client named.
	if _, err := create(s.c, t, evil, tok{}); code(err) != codes.NotFound {
		t.Fatalf("create of an unknown id: %v", err)
	}
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(s.Log(), `\x1b[2J`); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the refused call's machine id is not in the log:\n%s", s.Log())
		}
	}
	providertest.Must(t, "configure")(configure(s.c, t, id, evil, map[string]string{"k\x1b[31m": "v\x07"}, tok{}))
	s.Kill() // the Configure stays in the state, in flight, for the offline plan

	out, code := runRaw(t, "plan", "--use-fake-backend", "--seed-count", "2", "--state", state, "--no-color", "--detailed-exitcode")
	if code != 2 {
		t.Fatalf("offline plan: exit %d\n%s", code, out)
	}
	if want := "cluster=" + strconv.Quote(evil); !strings.Contains(out, want) {
		t.Errorf("plan text lacks %s:\n%s", want, out)
	}
	for name, text := range map[string]string{"plan text": out, "provider log": s.Log()} {
		for _, r := range text {
			if r != '\n' && r != '\t' && !strconv.IsPrint(r) {
				t.Errorf("%s carries %U:\n%q", name, r, text)
				break
			}
		}
	}
	js, code := runRaw(t, "plan", "--use-fake-backend", "--seed-count", "2", "--state", state, "--json")
	if code != 0 && code != 2 {
		t.Fatalf("JSON plan: exit %d\n%s", code, js)
	}
	var p struct {
		Changes []struct {
			Intent *struct {
				Cluster string `json:"cluster"`
			} `json:"intent"`
		} `json:"changes"`
	}
	if err := json.Unmarshal([]byte(js), &p); err != nil {
		t.Fatalf("JSON plan: %v\n%s", err, js)
	}
	if len(p.Changes) != 1 || p.Changes[0].Intent == nil || p.Changes[0].Intent.Cluster != evil {
		t.Errorf("JSON plan does not carry the exact cluster: %s", js)
	}
}
