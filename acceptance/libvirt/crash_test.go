//go:build integration

package libvirt

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/internal/providertest"
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
	if m.GetState() != providertest.StCreating && m.GetState() != providertest.StIdle {
		t.Fatalf("state after restart = %s, want CREATING (or IDLE)", m.GetState())
	}
	m = p.waitState(id, providertest.StIdle, 3*time.Minute)
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

// countingHook replaces the tiny guest's bootstrap hook: it counts its
// runs in the guest, holds long enough for the provider to be killed
// while it runs, checks the blob is in place, and records the cluster.
const countingHook = `#!/bin/sh
mkdir -p /var/lib/bigfleet
echo "run $$ $1" >> /var/lib/bigfleet/hook-runs
sleep 6
blob="${2:-/opt/bigfleet/bootstrap.blob}"
[ -f "$blob" ] || { echo "bootstrap: no blob at $blob" >&2; exit 4; }
printf '%s' "$1" > /var/lib/bigfleet/hook-cluster
exit 0
`

// Scenario: issue 17 item 5 on the real libvirtd with the real qemu-ga.
// The provider is SIGKILLed mid-Configure, once while the bootstrap hook
// runs in the guest and once the moment the blob is staged in the guest
// (the hook may or may not have started); restarted on the same --state,
// without the blob in memory, it follows the guest's record of the hook:
// both machines end CONFIGURED and each guest ran its hook exactly once
// (counted inside the guest).
func TestKill9MidConfigure(t *testing.T) {
	t.Parallel()
	p := startProvider(t, oneZone(2))
	ids := []string{"a/tiny.1/000", "a/tiny.1/001"}
	doms := map[string]string{}
	for _, id := range ids {
		p.create(id)
	}
	for _, id := range ids {
		m := p.waitState(id, providertest.StIdle, 3*time.Minute)
		doms[id] = strings.TrimPrefix(m.GetHost().GetRef(), "a/")
		if err := writeGuestFile(doms[id], "/opt/bigfleet/bootstrap", []byte(countingHook), "0755"); err != nil {
			t.Fatalf("install the counting hook in %s: %v", doms[id], err)
		}
	}
	runs := func(dom string) []string {
		b, err := readGuestFile(dom, "/var/lib/bigfleet/hook-runs")
		if err != nil && !strings.Contains(err.Error(), "No such file") {
			t.Fatalf("read hook runs in %s: %v", dom, err)
		}
		var lines []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.TrimSpace(l) != "" {
				lines = append(lines, l)
			}
		}
		return lines
	}
	waitGuest := func(what string, ok func() bool) {
		for end := time.Now().Add(3 * time.Minute); !ok(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("waited 3m for %s", what)
			}
		}
	}
	blob := []byte("kubeadm join 10.0.0.1:6443 --token kill9.0123456789abcdef\n")

	// 1. Killed while the hook runs.
	t0 := p.configure(ids[0], "cluster-kill-1", blob)
	waitGuest("the hook to start", func() bool { return len(runs(doms[ids[0]])) > 0 })
	p.Kill()
	t.Logf("SIGKILLed the provider %s after Configure, while the hook ran", time.Since(t0).Round(time.Millisecond))
	p.Launch()
	p.waitState(ids[0], providertest.StConfigured, 3*time.Minute)

	// 2. Killed the moment the blob is staged in the guest.
	t0 = p.configure(ids[1], "cluster-kill-2", blob)
	staged := func() bool {
		code, out, _, err := guestExec(doms[ids[1]], "/bin/sh", "-c", "ls /run/bigfleet/stage/ 2>/dev/null; cat /var/lib/bigfleet/hook-runs 2>/dev/null")
		return err == nil && code == 0 && strings.TrimSpace(out) != ""
	}
	waitGuest("the blob to be staged", staged)
	p.Kill()
	t.Logf("SIGKILLed the provider %s after Configure, once the blob was staged (hook runs so far: %d)", time.Since(t0).Round(time.Millisecond), len(runs(doms[ids[1]])))
	p.Launch()
	p.waitState(ids[1], providertest.StConfigured, 3*time.Minute)

	for i, id := range ids {
		dom := doms[id]
		r := runs(dom)
		t.Logf("MEASURE kill -9 mid-Configure (%d): %s CONFIGURED, the hook ran %d time(s) in the guest: %q", i+1, id, len(r), r)
		if len(r) != 1 {
			t.Errorf("%s: hook runs in the guest %v, want exactly one", id, r)
		}
		if got, err := readGuestFile(dom, "/var/lib/bigfleet/hook-cluster"); err != nil || string(got) != fmt.Sprintf("cluster-kill-%d", i+1) {
			t.Errorf("%s: the hook saw cluster %q (%v)", id, got, err)
		}
		code, out, stderr, err := guestExec(dom, "/bin/sh", "-c", "cat /var/lib/bigfleet/ops/*-bootstrap/exit; ls /run/bigfleet/stage/ /opt/bigfleet/ 2>&1")
		if err != nil || code != 0 || !strings.HasPrefix(out, "0\n") || strings.Contains(out, "bootstrap.blob") || strings.Contains(out, "-bootstrap") {
			t.Errorf("%s: the guest's record and leftovers: exit %d %q %q %v; want exit 0 recorded, no blob left", id, code, out, stderr, err)
		}
		checkBinding(t, dom, p.inst, id, fmt.Sprintf("cluster-kill-%d", i+1))
	}
}
