package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/bigfleet-vm/provider/internal/providertest"
	"github.com/bigfleet-vm/provider/jsonplan"
)

// TestAdminAnswersOnceDurable: the simulator journals its world lazily,
// so an admin change must be durable before the endpoint answers, as a
// hypervisor's own API would be. A kill -9 right after the answer keeps
// it: the offline plan of the state still shows the resize.
func TestAdminAnswersOnceDurable(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	s := start(t, "--seed-count", "4", "--state", state, "--reconcile-interval", "0", "--fake-admin")
	id := speculative(t, s.c, 1)[0]
	toIdle(t, s.c, id)
	s.Admin("resize?machine=" + id + "&vcpu=9&memory_mib=1536")
	s.Kill()
	out, _ := runRaw(t, "plan", "--json", "--use-fake-backend", "--seed-count", "4", "--state", state)
	p, err := jsonplan.Decode([]byte(out))
	if err != nil {
		t.Fatalf("offline JSON plan: %v\n%s", err, out)
	}
	zone := strings.SplitN(id, "/", 2)[0]
	if !providertest.HasDrift(p, zone, "resized") {
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

// waitMetric waits until the metric is at least min.
func waitMetric(t *testing.T, s *server, name string, min float64, labels ...string) {
	t.Helper()
	providertest.WaitMetric(t, fmt.Sprint(name, labels), func() float64 { return s.Metric(name, labels...) },
		func(v float64) bool { return v >= min }, 20*time.Second)
}
