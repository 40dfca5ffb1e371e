//go:build integration

package libvirt

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/internal/providertest"
)

// killDaemon SIGKILLs libvirtd (a crash: no cleanup) and waits for it to
// be gone. Its QEMU processes keep running, as they do on a real host.
func killDaemon(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile("/run/libvirtd.pid")
	if err != nil {
		t.Fatalf("libvirtd pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("libvirtd pid: %v", err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill libvirtd %d: %v", pid, err)
	}
	for i := 0; alive(pid); i++ {
		if i > 100 {
			t.Fatal("libvirtd did not exit")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// alive reports whether pid runs. PID 1 on this machine kind does not reap
// daemonized children, so a zombie counts as dead.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) S ...: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// startDaemon starts libvirtd the way scripts/libvirt-up.sh does and waits
// for a real call to work.
func startDaemon(t *testing.T) time.Time {
	t.Helper()
	if out, err := exec.Command("libvirtd", libvirtdArgs()...).CombinedOutput(); err != nil {
		t.Fatalf("libvirtd -d: %v %s", err, out)
	}
	for i := 0; i < 300; i++ {
		if _, err := virsh("uri"); err == nil {
			return time.Now()
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("libvirtd did not answer after restart")
	return time.Time{}
}

// zoneLine returns the /readyz detail line of a zone.
func (p *provider) zoneLine(zone string) string {
	_, body := p.HTTPGet("/readyz")
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "zone "+zone+":") {
			return l
		}
	}
	return ""
}

func (p *provider) waitZone(zone string, ok bool, max time.Duration) string {
	p.t.Helper()
	deadline := time.Now().Add(max)
	for {
		l := p.zoneLine(zone)
		if strings.HasSuffix(l, ": ok") == ok {
			return l
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("/readyz zone %s line %q after %s, want ok=%t", zone, l, max, ok)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Scenario 4: libvirtd is SIGKILLed and restarted twice, first while the
// machine is CREATING (guest booting), then while it is CONFIGURING. The
// guests survive a daemon crash (QEMU keeps running and the restarted
// daemon reattaches), so the correct outcome is that the provider
// reconnects and each transition reaches its target state on the same
// QEMU process, with no FAILED and no second domain.
//
// Not parallel: no other test of the package runs while the daemon is down.
func TestDaemonRestart(t *testing.T) {
	p := startProvider(t, oneZone(1))
	t.Cleanup(func() { ensureDaemon(t) }) // runs before the sweep
	const id = "a/tiny.1/000"
	pfx := prefix(p.inst)

	// Phase 1: crash the daemon right after the domain starts.
	t0 := p.create(id)
	var dom string
	for {
		if time.Since(t0) > 2*time.Minute {
			t.Fatal("domain never started")
		}
		if d := domains(t, pfx); len(d) == 1 && domState(t, d[0]) == "running" {
			dom = d[0]
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	domid := strings.TrimSpace(mustVirsh(t, "domid", dom))
	killDaemon(t)
	killedAt := time.Now()
	st := p.get(id).GetState()
	t.Logf("libvirtd SIGKILLed %s after Create, machine %s", time.Since(t0).Round(time.Millisecond), st)
	line := p.waitZone("a", false, 15*time.Second)
	t.Logf("/readyz while down: %q (after %s)", line, time.Since(killedAt).Round(time.Millisecond))
	time.Sleep(4 * time.Second) // a couple of reconcile ticks with the daemon gone
	if st := p.get(id).GetState(); st != providertest.StCreating {
		t.Errorf("state with the daemon down = %s, want CREATING", st)
	}
	up := startDaemon(t)
	p.waitZone("a", true, time.Minute)
	t.Logf("MEASURE provider reconnect after libvirtd restart: %s", time.Since(up).Round(time.Millisecond))
	p.waitState(id, providertest.StIdle, 3*time.Minute)
	t.Logf("Create→IDLE with a daemon crash in the middle: %s", time.Since(t0).Round(time.Millisecond))
	if got := domains(t, pfx); len(got) != 1 || got[0] != dom {
		t.Errorf("domains = %v, want [%s]", got, dom)
	}
	if got := strings.TrimSpace(mustVirsh(t, "domid", dom)); got != domid {
		t.Errorf("domain id %s → %s: the guest was restarted", domid, got)
	}
	checkRunning(t, dom)

	// Phase 2: crash the daemon while the bootstrap runs.
	p.configure(id, "cluster-restart", []byte("blob across a daemon crash"))
	time.Sleep(300 * time.Millisecond)
	st = p.get(id).GetState()
	killDaemon(t)
	t.Logf("libvirtd SIGKILLed during Configure, machine %s", st)
	time.Sleep(3 * time.Second)
	if st := p.get(id).GetState(); st == providertest.StFailed {
		t.Errorf("machine FAILED with the daemon down: %q", p.get(id).GetLastError())
	}
	startDaemon(t)
	p.waitState(id, providertest.StConfigured, 3*time.Minute)
	summary, err := readGuestFile(dom, "/var/lib/bigfleet/received/summary")
	if err != nil || !strings.HasPrefix(string(summary), "cluster=cluster-restart ") {
		t.Errorf("hook summary after the daemon crash = %q, %v", summary, err)
	}
	checkBinding(t, dom, p.inst, id, "cluster-restart")
	if got := strings.TrimSpace(mustVirsh(t, "domid", dom)); got != domid {
		t.Errorf("domain id %s → %s: the guest was restarted", domid, got)
	}

	// Back to IDLE (the tiny guest needs a kubectl for Drain), then Delete.
	if err := writeGuestFile(dom, "/usr/bin/kubectl", []byte(fakeKubectl), "0755"); err != nil {
		t.Fatalf("install fake kubectl: %v", err)
	}
	p.drain(id, 0)
	p.waitState(id, providertest.StIdle, 2*time.Minute)
	p.delete(id)
	p.waitState(id, providertest.StSpeculative, 3*time.Minute)
	checkGone(t, sub.Pool, dom)
}

// libvirtdArgs is how scripts/libvirt-up.sh starts libvirtd (with
// --listen for the TLS listener); tests that restart the daemon use it.
func libvirtdArgs() []string {
	if a := strings.Fields(os.Getenv("BIGFLEET_LIBVIRTD_ARGS")); len(a) > 0 {
		return a
	}
	return []string{"-d"}
}
