package e2e

import (
	"encoding/json"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/internal/providertest"
)

// repairsJSON is GET /debug/repairs.
type repairsJSON struct {
	Total    int `json:"total"`
	Machines []struct {
		Machine  string `json:"machine"`
		Zone     string `json:"zone"`
		Error    string `json:"error"`
		Failures int    `json:"failures"`
		RetryIn  string `json:"retry_in"`
	} `json:"machines"`
}

func (s *server) repairs(t *testing.T) repairsJSON {
	t.Helper()
	code, body := s.HTTPGet("/debug/repairs")
	var r repairsJSON
	if code != 200 {
		t.Fatalf("/debug/repairs: %d %s", code, body)
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("/debug/repairs: %v\n%s", err, body)
	}
	return r
}

// TestRepairBudgetKeepsCreatesFlowing: 64 IDLE VMs on a host whose Start
// always times out (a flapping host) are stopped out of band, so 64 drift
// repairs keep failing retryably while the 32 workers serve. Each repair
// gives up after its budget and goes back to the queue with backoff, so a
// Create in the healthy zone still reaches IDLE well within its deadline
// (issue 18: a repair retried forever on its worker, so enough of them
// starved every Create). The failures are reported on /debug/repairs and
// in the repair-failure counter.
func TestRepairBudgetKeepsCreatesFlowing(t *testing.T) {
	const drifted = 64
	// 132 slots: 66 per zone. --create-timeout is the Create's usual
	// deadline; the bound below is well inside it.
	s := start(t, "--seed-count", "132", "--fake-admin", "--create-timeout", "5m")
	var sick, healthy []string
	for _, m := range providertest.ListAll(t, s.c, providertest.StSpeculative) {
		switch {
		case strings.HasPrefix(m.Id, "local-a/") && len(sick) < drifted:
			sick = append(sick, m.Id)
		case strings.HasPrefix(m.Id, "local-b/") && len(healthy) < 1:
			healthy = append(healthy, m.Id)
		}
	}
	if len(sick) != drifted || len(healthy) != 1 {
		t.Fatalf("slots: %d in local-a, %d in local-b", len(sick), len(healthy))
	}
	var wg sync.WaitGroup
	for _, id := range sick {
		wg.Add(1)
		go func() {
			defer wg.Done()
			toIdle(t, s.c, id)
		}()
	}
	wg.Wait()

	s.Admin("flaky?" + url.Values{"zone": {"local-a"}, "op": {"Start"}}.Encode())
	for _, id := range sick {
		s.Admin("stop?" + url.Values{"machine": {id}}.Encode())
	}
	// Every drifted machine's repair has tried Start at least once: the
	// workers are busy with them.
	deadline := time.Now().Add(pollDeadline)
	for s.Metric("bigfleet_provider_hypervisor_calls_total", `op="start"`, `outcome="error"`) < drifted {
		if time.Now().After(deadline) {
			t.Fatalf("the repairs did not start within %v", pollDeadline)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// A Create in the healthy zone, while the repairs keep failing.
	start := time.Now()
	providertest.Must(t, "Create "+healthy[0])(create(s.c, t, healthy[0], tok{}))
	const bound = 60 * time.Second // generous: well inside --create-timeout
	for {
		m := providertest.Get(t, s.c, healthy[0])
		if m.State == providertest.StIdle {
			break
		}
		if m.State == providertest.StFailed || time.Since(start) > bound {
			t.Fatalf("the Create in the healthy zone is %v after %v (last_error %q): the failing repairs starve it",
				m.State, time.Since(start).Round(time.Millisecond), m.LastError)
		}
		sleepPoll()
	}
	t.Logf("Create in the healthy zone reached IDLE %v after it was acknowledged, beside %d failing repairs",
		time.Since(start).Round(time.Millisecond), drifted)

	deadline = time.Now().Add(pollDeadline)
	r := s.repairs(t)
	for ; r.Total < drifted; r = s.repairs(t) {
		if time.Now().After(deadline) {
			t.Fatalf("/debug/repairs lists %d failing repairs, want %d", r.Total, drifted)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, f := range r.Machines[:1] {
		if f.Zone != "local-a" || f.Failures < 1 || f.RetryIn == "" || !strings.Contains(f.Error, "flapping host") {
			t.Errorf("repair failure %+v", f)
		}
	}
	if n := s.Metric("bigfleet_provider_repair_failures_total", `zone="local-a"`); n < drifted {
		t.Errorf("repair_failures_total{zone=local-a} = %v, want >= %d", n, drifted)
	}
	// The drifted machines stay IDLE: a repair that fails is retried, it
	// never fails the machine.
	for _, id := range sick[:4] {
		if m := providertest.Get(t, s.c, id); m.State != providertest.StIdle {
			t.Errorf("%s is %v", id, m.State)
		}
	}

	// The host recovers: every repair succeeds and leaves the list.
	s.Admin("flaky?" + url.Values{"zone": {"local-a"}, "op": {"Start"}, "on": {"false"}}.Encode())
	deadline = time.Now().Add(pollDeadline)
	for s.repairs(t).Total > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d repairs still failing %v after the host recovered", s.repairs(t).Total, pollDeadline)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
