//go:build integration

package libvirt

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// Scenario 3: the provider is SIGKILLed while CREATING, after the domain is
// defined but before the state write that records IDLE. Restarted on the
// same --state it adopts what exists: the machine reaches IDLE with exactly
// one domain and one overlay/seed pair.
func TestCrashAfterDefine(t *testing.T) {
	t.Parallel()
	p := startProvider(t, oneZone(1))
	const id = "a/tiny.1/000"
	pfx := prefix(p.inst)
	t0 := p.create(id)

	// Poll for the domain; kill the moment it is defined.
	var dom, stateAtKill string
	for dom == "" {
		if time.Since(t0) > 2*time.Minute {
			t.Fatal("domain never appeared")
		}
		if d := domains(t, pfx); len(d) > 0 {
			dom = d[0]
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.Kill()
	stateAtKill = domState(t, dom)
	t.Logf("SIGKILLed the provider %s after Create; domain %s was %q", time.Since(t0).Round(time.Millisecond), dom, stateAtKill)

	// The provider had not recorded IDLE: the restart must see CREATING.
	p.Launch()
	m := p.get(id)
	t.Logf("state after restart: %s", m.GetState())
	if m.GetState() != creating && m.GetState() != idle {
		t.Fatalf("state after restart = %s, want CREATING (or IDLE)", m.GetState())
	}
	m = p.waitState(id, idle, 3*time.Minute)
	t.Logf("MEASURE Create→IDLE across a provider crash: %s", time.Since(t0).Round(time.Millisecond))
	for _, l := range strings.Split(p.Log(), "\n") {
		if strings.Contains(l, "/resume ") || strings.Contains(l, "/start ") || strings.Contains(l, "/define ") {
			t.Logf("log: %s", l)
		}
	}

	if got := domains(t, pfx); !cmp.Equal([]string{dom}, got) {
		t.Errorf("domains after adoption = %v, want exactly [%s]", got, dom)
	}
	if ref := m.GetHost().GetRef(); ref != "a/"+dom {
		t.Errorf("host ref = %q, want a/%s", ref, dom)
	}
	vols, tags := splitTags(volumes(t, sub.Pool, pfx), dom)
	if d := cmp.Diff([]string{dom + "-cidata.iso", dom + "-disk.qcow2"}, vols); d != "" {
		t.Errorf("volumes after adoption (-want +got):\n%s", d)
	}
	if len(tags) != 1 {
		t.Errorf("identity tags after adoption: %v, want one", tags)
	}
	checkRunning(t, dom)
	checkBinding(t, dom, p.inst, id, "")

	// A few more reconcile ticks change nothing.
	time.Sleep(5 * time.Second)
	if got := domains(t, pfx); len(got) != 1 {
		t.Errorf("domains after more ticks = %v", got)
	}
	pl, src := p.currentPlan()
	for _, c := range pl.Changes {
		if len(c.Steps) > 0 || c.Fail != "" {
			t.Errorf("%s after adoption is not empty for %s: %+v", src, c.Machine, c)
		}
	}
	for _, d := range pl.Drift {
		t.Errorf("%s drift after adoption: %+v", src, d)
	}
}
