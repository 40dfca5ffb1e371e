//go:build integration

package libvirt

import (
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/internal/providertest"
)

// deadURI is a libvirt URI whose unix socket does not exist: the host is
// unreachable from the first dial on.
const deadURI = "qemu:///system?socket=/run/bigfleet-acceptance-no-such.sock"

// checkUnknownHost checks a plan for zone "dead": unknown, an unknown-host
// drift, and no step (let alone a create or destroy) targeting it.
func checkUnknownHost(t *testing.T, pl plan, src string) {
	t.Helper()
	statuses := map[string]string{}
	for _, z := range pl.Zones {
		statuses[z.Name] = z.Status
	}
	if statuses["dead"] == "ok" || statuses["dead"] == "" {
		t.Errorf("%s: zone dead status %q, want unknown", src, statuses["dead"])
	}
	if statuses["a"] != "ok" {
		t.Errorf("%s: zone a status %q, want ok (zones %+v)", src, statuses["a"], pl.Zones)
	}
	found := false
	for _, d := range pl.Drift {
		if d.Zone == "dead" && d.Kind == "unknown-host" {
			found = true
		}
		if d.Zone == "a" && d.Kind == "unknown-host" {
			t.Errorf("%s: healthy zone a reported unknown: %+v", src, d)
		}
	}
	if !found {
		t.Errorf("%s: no unknown-host drift for zone dead: %+v", src, pl.Drift)
	}
	for _, c := range pl.Changes {
		for _, s := range c.Steps {
			if s.Target.Zone == "dead" {
				t.Errorf("%s: step %s (%s) targets the unknown zone", src, s.ID, s.Action)
			}
		}
		if c.Zone == "dead" && c.Fail != "" && !strings.Contains(c.Fail, "timed out") {
			t.Errorf("%s: machine %s in the unknown zone planned to fail: %q", src, c.Machine, c.Fail)
		}
	}
}

// Scenario 5: a second zone whose host is unreachable. The provider starts
// anyway, /readyz shows that zone unhealthy, the plan reports it as
// unknown-host with nothing planned there, a Create in it waits in
// CREATING until the create timeout, and the healthy zone keeps working.
func TestUnreachableZone(t *testing.T) {
	t.Parallel()
	const createTimeout = 40 * time.Second
	p := startProvider(t, config{
		connect: "a=" + sub.URI + ",dead=" + deadURI,
		pools:   "a=" + sub.Pool + ",dead=" + sub.Pool,
		offerings: []offering{{InstanceType: "tiny.1", Zone: "a", Count: 1},
			{InstanceType: "tiny.1", Zone: "dead", Count: 1}},
		extra: []string{"--create-timeout", createTimeout.String()},
	})
	const good, bad = "a/tiny.1/000", "dead/tiny.1/000"

	code, body := p.HTTPGet("/readyz")
	t.Logf("/readyz %d:\n%s", code, body)
	if code != http.StatusOK {
		t.Errorf("/readyz = %d, want 200 (one host down does not make the provider unready)", code)
	}
	if l := p.zoneLine("dead"); l == "" || strings.HasSuffix(l, ": ok") || !strings.Contains(l, "unreachable") {
		t.Errorf("/readyz detail for the dead zone = %q, want unreachable", l)
	}
	// The healthy zone may still be "connecting" when the provider first
	// answers (it never waits for a dial; on a loaded machine the first
	// one can take a moment): it must come up, whatever the dead zone does.
	if l := p.waitZone("a", true, 30*time.Second); l != "zone a: ok" {
		t.Errorf("/readyz detail for zone a = %q, want ok", l)
	}

	tBad := p.create(bad)
	tGood := p.create(good)
	p.waitState(good, providertest.StIdle, 3*time.Minute)
	t.Logf("MEASURE Create→IDLE in the healthy zone with another zone down: %s", time.Since(tGood).Round(time.Millisecond))

	pl, src := p.currentPlan()
	checkUnknownHost(t, pl, src)
	t.Run("offline-plan", func(t *testing.T) {
		pl, out, ok := p.offlinePlan()
		if !ok {
			t.Fatalf("provider plan --json (offline) failed: %s", out)
		}
		checkUnknownHost(t, pl, "provider plan --json (offline)")
	})

	// CREATING, not FAILED, until the create timeout; then FAILED.
	for time.Since(tBad) < createTimeout-5*time.Second {
		if m := p.get(bad); m.GetState() != providertest.StCreating {
			t.Fatalf("machine in the dead zone is %s after %s (last_error %q), want CREATING until the %s create timeout",
				m.GetState(), time.Since(tBad).Round(time.Second), m.GetLastError(), createTimeout)
		}
		time.Sleep(time.Second)
	}
	m := p.waitState(bad, providertest.StFailed, createTimeout+time.Minute)
	t.Logf("dead zone machine FAILED %s after Create: %q", time.Since(tBad).Round(time.Second), m.GetLastError())
	if !strings.Contains(m.GetLastError(), "timed out") {
		t.Errorf("last_error = %q, want a create timeout", m.GetLastError())
	}

	// The healthy zone still does destructive work while the other is down.
	dom := vmOf(t, p, p.get(good))
	p.delete(good)
	p.waitState(good, providertest.StSpeculative, 3*time.Minute)
	checkGone(t, sub.Pool, dom)
}

// Scenario 6: two zones on two pools. Each machine's overlay and seed live
// in its own zone's pool, backed by that pool's golden image.
func TestTwoZonesTwoPools(t *testing.T) {
	t.Parallel()
	p := startProvider(t, config{
		connect: "a=" + sub.URI + ",b=" + sub.URI,
		pools:   "a=" + sub.Pool + ",b=" + sub.Pool2,
		offerings: []offering{{InstanceType: "tiny.1", Zone: "a", Count: 1},
			{InstanceType: "tiny.1", Zone: "b", Count: 1}},
	})
	const ida, idb = "a/tiny.1/000", "b/tiny.1/000"
	p.create(ida)
	p.create(idb)
	ma := p.waitState(ida, providertest.StIdle, 3*time.Minute)
	mb := p.waitState(idb, providertest.StIdle, 3*time.Minute)
	doma := strings.TrimPrefix(ma.GetHost().GetRef(), "a/")
	domb := strings.TrimPrefix(mb.GetHost().GetRef(), "b/")
	got, want := domains(t, prefix(p.inst)), []string{doma, domb}
	sort.Strings(got)
	sort.Strings(want)
	if !cmp.Equal(want, got) {
		t.Errorf("domains = %v, want %v", got, want)
	}
	checkRunning(t, doma)
	checkRunning(t, domb)
	checkVolumes(t, sub.Pool, doma)
	checkVolumes(t, sub.Pool2, domb)
	if v := volumes(t, sub.Pool, domb); len(v) > 0 {
		t.Errorf("zone b volumes in zone a's pool: %v", v)
	}
	if v := volumes(t, sub.Pool2, doma); len(v) > 0 {
		t.Errorf("zone a volumes in zone b's pool: %v", v)
	}

	// Both zones are one daemon here, so each zone's listing also shows
	// the other zone's domain. Record what the plan makes of that.
	pl, src := p.currentPlan()
	for _, d := range pl.Drift {
		t.Logf("%s drift with two zones on one host: %+v", src, d)
	}
	for _, c := range pl.Changes {
		if len(c.Steps) > 0 || c.Fail != "" {
			t.Errorf("%s: unexpected change for %s: %+v", src, c.Machine, c)
		}
	}

	p.delete(ida)
	p.delete(idb)
	p.waitState(ida, providertest.StSpeculative, 3*time.Minute)
	p.waitState(idb, providertest.StSpeculative, 3*time.Minute)
	checkGone(t, sub.Pool, doma)
	checkGone(t, sub.Pool2, domb)
}
