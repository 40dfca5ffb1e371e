//go:build integration

package libvirt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
	"github.com/bigfleet-vm/provider/observed"
)

// smallSpec is a domain that is defined but never started.
func smallSpec(pool string, m machine) lvspec.DomainSpec {
	return lvspec.DomainSpec{Name: m.name, VCPU: 1, MemoryMiB: 64, DomainType: "qemu", Pool: pool,
		Overlay: m.overlay, Seed: m.seed, Network: "user", Marker: m.marker}
}

func countOwned(z *observed.Zone, machineID string) int {
	n := 0
	for _, v := range z.VMs {
		if v.Marker != nil && v.Marker.MachineID == machineID {
			n++
		}
	}
	return n
}

// A crash between define and start: a restarted adapter re-defines (adopts)
// and starts without making a second domain; a foreign installation's
// domain of the same name is ErrExists and is never stopped or undefined.
func TestIntegrationCrashBetweenDefineAndStart(t *testing.T) {
	e := needEnv(t)
	inst := "it-" + randHex(4)
	h1 := newITInst(t, e, inst, ZoneURI{Zone: "a", URI: e.URI})
	m := newMachine(h1, "crash-1")
	ctx := ctxT(t, 2*time.Minute)
	if err := h1.CreateOverlay(ctx, "a", lvspec.OverlaySpec{Pool: e.Pool, Name: m.overlay, BaseImage: e.Image}); err != nil {
		t.Fatal(err)
	}
	spec := smallSpec(e.Pool, m)
	spec.Seed = ""
	if err := h1.DefineDomain(ctx, "a", spec); err != nil {
		t.Fatalf("define: %v", err)
	}
	_ = h1.Close() // "crash"

	h2 := newITInst(t, e, inst, ZoneURI{Zone: "a", URI: e.URI})
	cleanupMachine(t, h2, "a", e.Pool, m)
	if err := h2.DefineDomain(ctx, "a", spec); err != nil {
		t.Fatalf("re-define after crash: %v", err)
	}
	tg := hypervisors.Target{Zone: "a", Name: m.name}
	if err := h2.Start(ctx, tg); err != nil {
		t.Fatalf("start: %v", err)
	}
	if err := h2.Start(ctx, tg); err != nil {
		t.Fatalf("second start: %v", err)
	}
	z, err := h2.Observe(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if n := countOwned(z, m.marker.MachineID); n != 1 {
		t.Errorf("owned domains for the machine = %d, want 1", n)
	}

	// Another installation sees the name as taken and may not touch it.
	other := newIT(t, e, ZoneURI{Zone: "a", URI: e.URI})
	ospec := spec
	ospec.Marker.Installation = other.cfg.Installation
	if err := other.DefineDomain(ctx, "a", ospec); !errors.Is(err, hypervisors.ErrExists) {
		t.Errorf("foreign define: %v, want ErrExists", err)
	}
	if err := other.Stop(ctx, tg, 0); !errors.Is(err, hypervisors.ErrNotOwned) {
		t.Errorf("foreign stop: %v, want ErrNotOwned", err)
	}
	if err := other.UndefineDomain(ctx, tg); !errors.Is(err, hypervisors.ErrNotOwned) {
		t.Errorf("foreign undefine: %v, want ErrNotOwned", err)
	}
	oz, err := other.Observe(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range oz.VMs {
		if v.Name == m.name && v.Marker != nil {
			t.Errorf("foreign installation sees our domain as owned: %+v", v.Marker)
		}
	}
	// Same installation, other machine: also ErrExists.
	wrong := spec
	wrong.Marker.MachineID = "someone-else"
	if err := h2.DefineDomain(ctx, "a", wrong); !errors.Is(err, hypervisors.ErrExists) {
		t.Errorf("define for another machine: %v, want ErrExists", err)
	}
}

// A zone whose URI points at a dead socket is unreachable at once and
// never blocks the healthy zone; New does not wait for it.
func TestIntegrationDeadZone(t *testing.T) {
	e := needEnv(t)
	t0 := time.Now()
	h := newIT(t, e, ZoneURI{Zone: "good", URI: e.URI},
		ZoneURI{Zone: "dead", URI: "qemu:///system?socket=/run/bigfleet-no-such.sock"})
	ctx := ctxT(t, time.Minute)
	if _, err := h.Observe(ctx, "good"); err != nil {
		t.Fatalf("good zone: %v", err)
	}
	t1 := time.Now()
	z, err := h.Observe(ctx, "dead")
	if !errors.Is(err, hypervisors.ErrUnreachable) || z == nil || z.Status != observed.StatusUnknown {
		t.Fatalf("dead zone: %v %+v, want ErrUnreachable and StatusUnknown", err, z)
	}
	if d := time.Since(t1); d > time.Second {
		t.Errorf("dead zone Observe took %s", d)
	}
	if err := h.Start(ctx, hypervisors.Target{Zone: "dead", Name: "x"}); !errors.Is(err, hypervisors.ErrUnreachable) {
		t.Errorf("Start on dead zone: %v", err)
	}
	health := h.ZoneHealth()
	if health["good"] != nil || !errors.Is(health["dead"], hypervisors.ErrUnreachable) {
		t.Errorf("ZoneHealth = %v", health)
	}
	t.Logf("MEASURE New+first dial of both zones: %s", t1.Sub(t0).Round(time.Millisecond))
}

// Two zones on two pools: volumes land in and are observed from each
// zone's own pool.
func TestIntegrationTwoZonesTwoPools(t *testing.T) {
	e := needEnv(t)
	if e.Pool2 == "" {
		t.Fatal("BIGFLEET_LIBVIRT_POOL2 unset")
	}
	h := newIT(t, e, ZoneURI{Zone: "a", URI: e.URI, Pool: e.Pool}, ZoneURI{Zone: "b", URI: e.URI, Pool: e.Pool2})
	ctx := ctxT(t, time.Minute)
	ma, mb := newMachine(h, "two-a"), newMachine(h, "two-b")
	cleanupMachine(t, h, "a", e.Pool, ma)
	cleanupMachine(t, h, "b", e.Pool2, mb)
	if err := h.CreateOverlay(ctx, "a", lvspec.OverlaySpec{Pool: e.Pool, Name: ma.overlay, BaseImage: e.Image}); err != nil {
		t.Fatal(err)
	}
	if err := h.CreateOverlay(ctx, "b", lvspec.OverlaySpec{Pool: e.Pool2, Name: mb.overlay, BaseImage: e.Image}); err != nil {
		t.Fatal(err)
	}
	for zone, want := range map[string]string{"a": ma.overlay, "b": mb.overlay} {
		z, err := h.Observe(ctx, zone)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, v := range z.Volumes {
			if strings.Contains(v.Name, "-two-") {
				names = append(names, v.Pool+"/"+v.Name)
			}
		}
		if len(names) != 1 || !strings.HasSuffix(names[0], "/"+want) {
			t.Errorf("zone %s volumes = %v, want only %s", zone, names, want)
		}
	}
}

func daemonPID(t *testing.T) int {
	b, err := os.ReadFile("/run/libvirtd.pid")
	if err != nil {
		t.Fatalf("libvirtd pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("libvirtd pid: %v", err)
	}
	return pid
}

// libvirtd killed and restarted mid-run: calls fail with a retryable class
// meanwhile, and the adapter reconnects by itself.
func TestIntegrationDaemonRestart(t *testing.T) {
	e := needEnv(t)
	h := newIT(t, e, ZoneURI{Zone: "a", URI: e.URI})
	ctx := ctxT(t, 2*time.Minute)
	if _, err := h.Observe(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	drain(h)
	pid := daemonPID(t)
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatalf("kill libvirtd: %v", err)
	}
	// The outage shows at once: the socket closes, health withdraws "up"
	// and a zone-down event is sent.
	for h.ZoneHealth()["a"] == nil {
		if time.Since(killed) > 5*time.Second {
			t.Fatal("zone still healthy 5s after libvirtd was stopped")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("MEASURE libvirtd stopped -> zone down: %s (%v)", time.Since(killed).Round(time.Millisecond), h.ZoneHealth()["a"])
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			_ = exec.Command("libvirtd", libvirtdArgs()...).Run()
		}
	})
	for i := 0; syscall.Kill(pid, 0) == nil; i++ {
		if i > 100 {
			t.Fatal("libvirtd did not exit")
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, err := h.Observe(ctx, "a")
	if err == nil || !hypervisors.Retryable(err) {
		t.Errorf("Observe with the daemon down: %v, want a retryable error", err)
	}
	if out, err := exec.Command("libvirtd", libvirtdArgs()...).CombinedOutput(); err != nil {
		t.Fatalf("restart libvirtd: %v %s", err, out)
	}
	restarted = true
	t0 := time.Now()
	gotUp := make(chan time.Duration, 1)
	go func() {
		for ev := range h.Events() {
			if ev.Zone == "a" && ev.Kind == hypervisors.EventZoneUp {
				gotUp <- time.Since(t0)
				return
			}
		}
	}()
	for {
		_, err := h.Observe(ctx, "a")
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("adapter never recovered: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("MEASURE reconnect after daemon restart: %s", time.Since(t0).Round(time.Millisecond))
	select {
	case d := <-gotUp:
		t.Logf("MEASURE daemon answering -> zone-up event: %s", d.Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Error("no zone-up event after the daemon came back")
	}
	if h.ZoneHealth()["a"] != nil {
		t.Errorf("health after recovery: %v", h.ZoneHealth()["a"])
	}
}

// Observe's libvirt calls per tick on a host with a few hundred domains,
// ours and not ours, shut off, seen as two zones (hosts): a cold tick reads
// every domain once; a steady tick costs a constant per zone whatever the
// domain count; a tick after k domains changed state costs k more.
// O(hosts + changed domains), not O(domains).
func TestIntegrationObserveCallsAtScale(t *testing.T) {
	e := needEnv(t)
	h := newIT(t, e, ZoneURI{Zone: "a", URI: e.URI}, ZoneURI{Zone: "b", URI: e.URI})
	ctx := ctxT(t, 10*time.Minute)
	const ours, foreign = 150, 150
	t0 := time.Now()
	for i := 0; i < ours; i++ {
		m := newMachine(h, fmt.Sprintf("scale-%03d", i))
		cleanupMachine(t, h, "a", e.Pool, m)
		if err := h.DefineDomain(ctx, "a", smallSpec(e.Pool, m)); err != nil {
			t.Fatalf("define %d: %v", i, err)
		}
	}
	var foreignNames []string
	for i := 0; i < foreign; i++ {
		name := fmt.Sprintf("foreign-%s-%03d", h.cfg.Installation, i)
		foreignNames = append(foreignNames, name)
		xml := fmt.Sprintf(`<domain type='qemu'><name>%s</name><memory unit='MiB'>32</memory><os><type arch='x86_64'>hvm</type></os></domain>`, name)
		if err := h.zones["a"].rpc(ctx, "DomainDefineXMLFlags", "define foreign", 0, func(l *golibvirt.Libvirt) error {
			_, err := l.DomainDefineXMLFlags(xml, 0)
			return err
		}); err != nil {
			t.Fatalf("define foreign %d: %v", i, err)
		}
	}
	t.Cleanup(func() {
		for _, n := range foreignNames {
			_ = exec.Command("virsh", "-c", e.URI, "destroy", n).Run()
			_ = exec.Command("virsh", "-c", e.URI, "undefine", n).Run()
		}
	})
	t.Logf("MEASURE define %d owned + %d foreign domains: %s", ours, foreign, time.Since(t0).Round(time.Millisecond))
	total := 0
	// evented waits until no event has arrived for half a second and
	// returns the distinct domains events named since the last call: each
	// is re-read once per zone at the next tick (the daemon is shared, so
	// other users' domains can raise events too).
	evented := func() map[string]bool {
		names := map[string]bool{}
		for {
			select {
			case ev := <-h.Events():
				if ev.Kind == hypervisors.EventVM {
					names[ev.VM] = true
				}
			case <-time.After(500 * time.Millisecond):
				return names
			}
		}
	}
	tick := func(label string) int64 {
		before := h.Calls()
		t0 := time.Now()
		owned := 0
		for _, zone := range []string{"a", "b"} {
			z, err := h.Observe(ctx, zone)
			if err != nil {
				t.Fatalf("Observe %s %s: %v", zone, label, err)
			}
			total = len(z.VMs)
			for _, v := range z.VMs {
				if v.Marker != nil {
					owned++
				}
			}
		}
		if owned != 2*ours {
			t.Errorf("%s: owned VMs over both zones = %d, want %d", label, owned, 2*ours)
		}
		calls := h.Calls() - before
		t.Logf("MEASURE observe tick %s, 2 zones x %d domains: %d libvirt calls, %s", label, total, calls, time.Since(t0).Round(time.Millisecond))
		return calls
	}
	const perZone = 3 // stats listing, autostart listing, volume listing
	// check: at most the listings plus one read per zone of each domain
	// that changed or raised an event, and at least the listings plus the
	// reads of the mustRead domains we changed ourselves.
	check := func(label string, calls int64, changed map[string]bool, mustRead int) {
		t.Helper()
		most, least := int64(2*(perZone+len(changed))), int64(2*(perZone+mustRead))
		if calls > most || calls < least {
			t.Errorf("%s: %d calls, want %d..%d (%d per zone + one read per zone of each changed domain; changed or evented: %v)",
				label, calls, least, most, perZone, changed)
		}
	}
	evented()
	tick("cold")
	ev := evented()
	check("steady", tick("steady"), ev, 0)
	// k domains change state behind the adapter's back (started by virsh).
	changed := []string{foreignNames[3], foreignNames[77], foreignNames[140]}
	for _, n := range changed {
		if out, err := exec.Command("virsh", "-c", e.URI, "start", n).CombinedOutput(); err != nil {
			t.Fatalf("virsh start %s: %v %s", n, err, out)
		}
	}
	ev = evented()
	for _, n := range changed {
		ev[n] = true
	}
	check(fmt.Sprintf("after %d changed", len(changed)), tick(fmt.Sprintf("after %d changed", len(changed))), ev, len(changed))
	ev = evented()
	check("steady again", tick("steady again"), ev, 0)
	for _, n := range changed {
		_ = exec.Command("virsh", "-c", e.URI, "destroy", n).Run()
	}
}

// An out-of-band edit of a definition (virsh edit) changes neither the domain's id nor
// its state, so the cached read used to hide it until RefreshEvery
// (5 min); its lifecycle event ("defined") now makes the next Observe
// re-read exactly that domain.
func TestIntegrationEventRefreshesDefinition(t *testing.T) {
	e := needEnv(t)
	h := newIT(t, e, ZoneURI{Zone: "a", URI: e.URI})
	ctx := ctxT(t, 2*time.Minute)
	m := newMachine(h, "edit-1")
	cleanupMachine(t, h, "a", e.Pool, m)
	if err := h.DefineDomain(ctx, "a", smallSpec(e.Pool, m)); err != nil {
		t.Fatal(err)
	}
	mem := func() int {
		t.Helper()
		z, err := h.Observe(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range z.VMs {
			if v.Name == m.name {
				return v.MemoryMiB
			}
		}
		t.Fatalf("%s not listed", m.name)
		return 0
	}
	if got := mem(); got != 64 {
		t.Fatalf("memory %d MiB, want 64", got)
	}
	// Our own define's event may still be on its way: wait until quiet.
	for quiet := false; !quiet; {
		select {
		case <-h.Events():
		case <-time.After(500 * time.Millisecond):
			quiet = true
		}
	}
	// What "virsh edit" does: dump, change, define again.
	x, err := exec.Command("virsh", "-c", e.URI, "dumpxml", "--inactive", m.name).Output()
	if err != nil {
		t.Fatal(err)
	}
	edited := regexp.MustCompile(`<memory unit='KiB'>\d+</memory>`).ReplaceAllString(string(x), "<memory unit='KiB'>98304</memory>")
	edited = regexp.MustCompile(`<currentMemory unit='KiB'>\d+</currentMemory>`).ReplaceAllString(edited, "<currentMemory unit='KiB'>98304</currentMemory>")
	f := filepath.Join(t.TempDir(), "edited.xml")
	if err := os.WriteFile(f, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("virsh", "-c", e.URI, "define", f).CombinedOutput(); err != nil {
		t.Fatalf("virsh define: %v %s", err, out)
	}
	deadline := time.After(10 * time.Second)
	for seen := false; !seen; {
		select {
		case ev := <-h.Events():
			seen = ev.Kind == hypervisors.EventVM && ev.VM == m.name
			if seen && ev.MachineID != m.marker.MachineID {
				t.Errorf("event names machine %q, want %q", ev.MachineID, m.marker.MachineID)
			}
		case <-deadline:
			t.Fatal("no event for the edited domain")
		}
	}
	before := h.Calls()
	if got := mem(); got != 96 {
		t.Errorf("memory after the edit %d MiB, want 96", got)
	}
	if calls := h.Calls() - before; calls != 4 {
		t.Errorf("tick after one edited domain made %d calls, want 4 (3 + 1 read)", calls)
	}
}

// Connections closed while their event subscription is being registered or
// deregistered must not take libvirtd down. libvirtd 9.0 frees a closing
// client's callback array while a worker may still be dispatching that
// client's ConnectDomainEventCallbackRegisterAny (log: "unexpected
// incomplete domain callback", then a segfault in
// remoteClientFreePrivateCallbacks); the adapter must never close a
// connection with such an RPC unanswered. Each round opens an adapter and
// closes it at once, as a test's cleanup or a provider shutting down
// right after it connected does; the daemon must be the same process,
// answering, at the end.
func TestIntegrationCloseWhileSubscribing(t *testing.T) {
	e := needEnv(t)
	pid := daemonPID(t)
	// libvirtd logs the race itself even when it survives it.
	const daemonLog, raced = "/var/log/libvirt/libvirtd.log", "unexpected incomplete domain callback"
	racedBefore := countLines(daemonLog, raced)
	const rounds, workers = 20000, 4
	var wg sync.WaitGroup
	var died atomic.Bool
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds / workers {
				if died.Load() {
					return
				}
				h, err := New(Config{Zones: []ZoneURI{{Zone: "a", URI: e.URI}}, Installation: "it-" + randHex(4),
					Pool: e.Pool, CallTimeout: 10 * time.Second, MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second},
					slog.New(slog.NewTextHandler(io.Discard, nil)))
				if err != nil {
					t.Errorf("New: %v", err)
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err = h.WaitConnected(ctx)
				cancel()
				// Spread the close over the registration's round trip.
				time.Sleep(time.Duration((w*rounds+i)%7) * 50 * time.Microsecond)
				_ = h.Close()
				if err != nil || syscall.Kill(pid, 0) != nil {
					died.Store(true)
				}
			}
		}()
	}
	wg.Wait()
	if syscall.Kill(pid, 0) != nil {
		// Bring a daemon back for the tests after this one.
		_ = exec.Command("libvirtd", libvirtdArgs()...).Run()
		t.Fatalf("libvirtd (pid %d) died while adapters closed during their event subscription", pid)
	}
	h := newIT(t, e, ZoneURI{Zone: "a", URI: e.URI})
	if _, err := h.Observe(ctxT(t, 20*time.Second), "a"); err != nil {
		t.Fatalf("libvirtd no longer answers after %d closes: %v", rounds, err)
	}
	if n := countLines(daemonLog, raced) - racedBefore; n > 0 {
		t.Errorf("libvirtd logged %q %d times: a connection closed under a registration", raced, n)
	}
}

// countLines counts the lines of file holding s (0 when it cannot be read).
func countLines(file, s string) int {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), s)
}
