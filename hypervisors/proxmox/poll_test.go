package proxmox

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvemarker"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvesim"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvespec"
	"github.com/bigfleet-vm/provider/naming"
	"github.com/bigfleet-vm/provider/observed"
)

var nodes3 = []string{"pve1", "pve2", "pve3"}

// polling turns the poller on at interval (the default timeouts apply).
func polling(interval time.Duration) func(*Config) {
	return func(c *Config) { c.PollInterval = interval }
}

// hangGuard bounds every wait for an event: a guard against a hung test,
// not a speed assertion (benchmarks measure speed).
const hangGuard = 20 * time.Second

// nextEvent returns the next event that satisfies pred, dropping others.
func nextEvent(t testing.TB, a *Adapter, what string, pred func(hypervisors.Event) bool) hypervisors.Event {
	t.Helper()
	deadline := time.After(hangGuard)
	for {
		select {
		case ev, ok := <-a.Events():
			if !ok {
				t.Fatalf("event channel closed while waiting for %s", what)
			}
			if pred(ev) {
				return ev
			}
		case <-deadline:
			t.Fatalf("no %s within %s; health %v", what, hangGuard, a.ZoneHealth())
		}
	}
}

// waitZones waits until each of zones has sent an event of kind.
func waitZones(t testing.TB, a *Adapter, kind hypervisors.EventKind, zones ...string) {
	t.Helper()
	left := map[string]bool{}
	for _, z := range zones {
		left[z] = true
	}
	for len(left) > 0 {
		ev := nextEvent(t, a, fmt.Sprintf("%s of %v", kind, zones), func(ev hypervisors.Event) bool { return ev.Kind == kind && left[ev.Zone] })
		delete(left, ev.Zone)
	}
}

func isVM(name string) func(hypervisors.Event) bool {
	return func(ev hypervisors.Event) bool { return ev.Kind == hypervisors.EventVM && ev.VM == name }
}

// ownedVM adds a running VM of this installation for machine on node.
func ownedVM(t testing.TB, e *env, vmid int, node, machine string) string {
	t.Helper()
	m := marker(machine)
	name := naming.VMName(testInst, machine, 1)
	if err := e.sim.AddVM(pvesim.VMSpec{VMID: vmid, Node: node, Name: name, Tags: pvemarker.Tags(m),
		Description: pvemarker.Description(m), Running: true}); err != nil {
		t.Fatal(err)
	}
	return name
}

// manualPoller starts the poller of e's adapter (which must have it off)
// driven by the returned function: each call makes one poll and returns
// once its events are queued. The baseline poll has run on return.
func manualPoller(t testing.TB, e *env) (poll func()) {
	t.Helper()
	done := make(chan struct{})
	ticks := make(chan time.Time)
	e.a.afterPoll = func() { done <- struct{}{} }
	e.a.startPolling(ticks, nil)
	<-done
	return func() {
		ticks <- time.Now()
		<-done
	}
}

// TestPollReportsOutOfBandChanges: a VM stopped, started or deleted behind
// the adapter's back, or a new VM of this installation, is pushed by the
// next poll as an EventVM naming the zone, the VM and (once the adapter
// has read its marker) the machine. Foreign VMs are never reported.
func TestPollReportsOutOfBandChanges(t *testing.T) {
	e := newEnv(t, nil, nil)
	names := map[int]string{}
	for i, n := range nodes3 {
		names[500+i] = ownedVM(t, e, 500+i, n, fmt.Sprintf("m-%d", i))
	}
	if err := e.sim.AddVM(pvesim.VMSpec{VMID: 600, Node: "pve1", Name: "someone-else", Running: true}); err != nil {
		t.Fatal(err)
	}
	// What the reconciler's first pass does: the marker gives the machine.
	for _, z := range nodes3 {
		if _, err := e.a.Observe(ctxT(t, 10*time.Second), z); err != nil {
			t.Fatal(err)
		}
	}
	poll := manualPoller(t, e)
	waitZones(t, e.a, hypervisors.EventZoneUp, nodes3...)
	newName := naming.VMName(testInst, "m-new", 1)
	tests := []struct {
		name   string
		change func()
		want   hypervisors.Event
	}{{
		name:   "stopped",
		change: func() { e.sim.SetPower(600, false); e.sim.SetPower(500, false) },
		want:   hypervisors.Event{Zone: "pve1", Kind: hypervisors.EventVM, VM: names[500], MachineID: "m-0", Detail: "stopped"},
	}, {
		name:   "started",
		change: func() { e.sim.SetPower(500, true) },
		want:   hypervisors.Event{Zone: "pve1", Kind: hypervisors.EventVM, VM: names[500], MachineID: "m-0", Detail: "started"},
	}, {
		name:   "deleted",
		change: func() { e.sim.RemoveVM(600); e.sim.RemoveVM(501) },
		want:   hypervisors.Event{Zone: "pve2", Kind: hypervisors.EventVM, VM: names[501], MachineID: "m-1", Detail: "undefined"},
	}, {
		// Not read by Observe yet: no machine id, the VM name serves.
		name:   "defined",
		change: func() { ownedVM(t, e, 503, "pve3", "m-new") },
		want:   hypervisors.Event{Zone: "pve3", Kind: hypervisors.EventVM, VM: newName, Detail: "defined"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.change()
			poll()
			got := nextEvent(t, e.a, "vm event", func(hypervisors.Event) bool { return true })
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("event (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPollReportsOnItsOwnClock: with the poller on its own ticker, an
// out-of-band stop arrives as an event (BenchmarkOutOfBandStopToEvent
// measures how soon).
func TestPollReportsOnItsOwnClock(t *testing.T) {
	e := newEnv(t, nil, polling(50*time.Millisecond))
	name := ownedVM(t, e, 500, "pve2", "m-0")
	waitZones(t, e.a, hypervisors.EventZoneUp, nodes3...)
	e.sim.SetPower(500, false)
	ev := nextEvent(t, e.a, "stop event", isVM(name))
	if ev.Zone != "pve2" || ev.Detail != "stopped" {
		t.Errorf("event = %+v, want pve2 stopped", ev)
	}
}

// TestPollQuietWhenNothingChanges: over an unchanged fleet of 1,000 VMs
// each tick costs exactly one request (GET /cluster/resources, no type
// filter: VMs and nodes at once) and pushes no event; one change then
// pushes exactly one.
func TestPollQuietWhenNothingChanges(t *testing.T) {
	e := newEnv(t, nil, nil) // poller off: the test drives it tick by tick
	fleet(t, e, 1000)
	var mu sync.Mutex
	var seen []string
	e.sim.SetRequestHook(func(w http.ResponseWriter, r *http.Request, serve func(http.ResponseWriter)) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.RequestURI())
		mu.Unlock()
		serve(w)
	})
	requests := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := seen
		seen = nil
		return out
	}
	for _, z := range nodes3 { // the reconciler's first pass
		if _, err := e.a.Observe(ctxT(t, 30*time.Second), z); err != nil {
			t.Fatal(err)
		}
	}
	requests()
	poll := manualPoller(t, e)
	waitZones(t, e.a, hypervisors.EventZoneUp, nodes3...)
	if got := requests(); len(got) != 1 {
		t.Fatalf("baseline poll made requests %q, want one", got)
	}
	const quiet = 5
	for i := range quiet {
		poll()
		if diff := cmp.Diff([]string{"GET /api2/json/cluster/resources"}, requests()); diff != "" {
			t.Fatalf("tick %d: requests (-want +got):\n%s", i, diff)
		}
	}
	// A sentinel change: the first event after the quiet ticks must be it.
	e.sim.SetPower(1001, true)
	poll()
	got := nextEvent(t, e.a, "any event", func(hypervisors.Event) bool { return true })
	want := hypervisors.Event{Zone: "pve2", Kind: hypervisors.EventVM, VM: naming.VMName(testInst, "m-0001", 1), MachineID: "m-0001", Detail: "started"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("first event after %d quiet ticks (-want +got):\n%s", quiet, diff)
	}
	// The reconciler's pass after the event is served by the poll's listing.
	before := e.sim.RequestCount("")
	z, err := e.a.Observe(ctxT(t, 10*time.Second), "pve2")
	if err != nil {
		t.Fatal(err)
	}
	if n := e.sim.RequestCount("") - before; n != 0 {
		t.Errorf("Observe after a poll made %d requests, want 0 (the poll's listing is fresh)", n)
	}
	for _, v := range z.VMs {
		if v.VMID == 1001 && v.Power != observed.PowerRunning {
			t.Errorf("Observe shows vm 1001 %s, want running", v.Power)
		}
	}
}

// TestAdapterChangesAreReportedWithTheirMachine: a clone the adapter made
// is reported with its machine before anything observed it.
func TestAdapterChangesAreReportedWithTheirMachine(t *testing.T) {
	e := newEnv(t, nil, polling(50*time.Millisecond))
	waitZones(t, e.a, hypervisors.EventZoneUp, nodes3...)
	id, err := e.a.CloneVM(ctxT(t, 10*time.Second), "pve2", cloneSpec("m-7"))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.a.ConfigureVM(ctxT(t, 10*time.Second), hypervisors.Target{Zone: "pve2", VMID: id},
		pvespec.SizeSpec{VCPU: 2, MemoryMiB: 2048, Marker: marker("m-7")}); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, e.a, "event of the clone", isVM(naming.VMName(testInst, "m-7", 1)))
	if ev.MachineID != "m-7" || ev.Zone != "pve2" {
		t.Errorf("event = %+v, want machine m-7 on pve2", ev)
	}
}

// TestZoneHealthConnectingFromTheFirstMoment: before the first poll
// answers, every node reports "connecting"; its answer brings them up.
func TestZoneHealthConnectingFromTheFirstMoment(t *testing.T) {
	e := newEnv(t, nil, func(c *Config) { c.APIURL = "" })
	release := make(chan struct{})
	e.sim.SetRequestHook(func(w http.ResponseWriter, r *http.Request, serve func(http.ResponseWriter)) {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		serve(w)
	})
	cfg := e.cfg
	cfg.APIURL, cfg.PollInterval = e.srv.URL+"/api2/json", time.Second
	cfg.StallAfter, cfg.PollTimeout = time.Hour, time.Hour // the first poll hangs until released
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	health := a.ZoneHealth()
	for _, n := range nodes3 {
		if err := health[n]; !errors.Is(err, hypervisors.ErrUnreachable) || !strings.Contains(err.Error(), "connecting") {
			t.Errorf("ZoneHealth[%s] = %v, want unreachable: connecting", n, err)
		}
	}
	close(release)
	waitZones(t, a, hypervisors.EventZoneUp, nodes3...)
	if diff := cmp.Diff(map[string]error{"pve1": nil, "pve2": nil, "pve3": nil}, a.ZoneHealth(), cmp.Comparer(errEqual)); diff != "" {
		t.Errorf("ZoneHealth after the first answer (-want +got):\n%s", diff)
	}
}

func errEqual(a, b error) bool {
	return (a == nil) == (b == nil) && (a == nil || a.Error() == b.Error())
}

// restartable serves the simulator on a fixed address that tests can take
// away (connection refused) and bring back, possibly with another
// certificate.
type restartable struct {
	t    *testing.T
	addr string
	sim  *pvesim.Server
	mu   sync.Mutex
	srv  *httptest.Server
}

func (r *restartable) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.srv.CloseClientConnections()
	r.srv.Close()
}

func (r *restartable) start(cert *tls.Certificate) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ln, err := net.Listen("tcp", r.addr)
	if err != nil {
		r.t.Fatalf("listen again on %s: %v", r.addr, err)
	}
	srv := httptest.NewUnstartedServer(r.sim.Handler())
	srv.Listener.Close()
	srv.Listener = ln
	srv.EnableHTTP2 = false
	if cert != nil {
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{*cert}}
	}
	srv.StartTLS()
	r.srv = srv
	r.t.Cleanup(srv.Close)
}

// TestZoneHealthWhenTheAPIFails: however the API fails (refused, a 5xx, a
// hang, a dropped connection, a certificate that does not match, a token
// it refuses), every node goes down with the reason and an EventZoneDown,
// never naming the node or showing the token secret; when the API answers
// again every node comes back with an EventZoneUp. Default intervals.
func TestZoneHealthWhenTheAPIFails(t *testing.T) {
	other, _, err := pvesim.SelfSigned([]string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	hook := func(h pvesim.RequestHook) func(*env, *restartable) func() {
		return func(e *env, _ *restartable) func() {
			e.sim.SetRequestHook(h)
			return func() { e.sim.SetRequestHook(nil) }
		}
	}
	tests := []struct {
		name   string
		brk    func(*env, *restartable) (restore func())
		reason string
	}{{
		name: "refused",
		brk: func(_ *env, r *restartable) func() {
			r.stop()
			return func() { r.start(nil) }
		},
		reason: "connection refused",
	}, {
		name: "503",
		brk: hook(func(w http.ResponseWriter, _ *http.Request, _ func(http.ResponseWriter)) {
			http.Error(w, `{"data":null}`, http.StatusServiceUnavailable)
		}),
		reason: "503 Service Unavailable",
	}, {
		name: "hang",
		brk: hook(func(_ http.ResponseWriter, r *http.Request, _ func(http.ResponseWriter)) {
			<-r.Context().Done()
		}),
		reason: "no answer from the API",
	}, {
		name: "dropped",
		brk: hook(func(w http.ResponseWriter, _ *http.Request, _ func(http.ResponseWriter)) {
			c, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				c.Close()
			}
		}),
		reason: "EOF",
	}, {
		name: "tls",
		brk: func(_ *env, r *restartable) func() {
			r.stop()
			r.start(&other)
			return func() { r.stop(); r.start(nil) }
		},
		reason: "certificate fingerprint mismatch",
	}, {
		name: "401",
		brk: func(e *env, _ *restartable) func() {
			e.sim.AddToken(pvesim.Token{ID: testToken, Secret: "rotated", ACL: pvesim.FullAccess()})
			return func() { e.sim.AddToken(pvesim.Token{ID: testToken, Secret: testSecret, ACL: pvesim.FullAccess()}) }
		},
		reason: "401",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, nil, func(c *Config) { c.APIURL = "" })
			r := &restartable{t: t, addr: e.srv.Listener.Addr().String(), sim: e.sim, srv: e.srv}
			cfg := e.cfg
			cfg.APIURL, cfg.PollInterval = e.srv.URL+"/api2/json", 0 // defaults
			a, err := New(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			waitZones(t, a, hypervisors.EventZoneUp, nodes3...)
			broke := time.Now()
			restore := tt.brk(e, r)
			waitZones(t, a, hypervisors.EventZoneDown, nodes3...)
			t.Logf("%s: every zone down %s after the API failed", tt.name, time.Since(broke).Round(time.Millisecond))
			health := a.ZoneHealth()
			for _, n := range nodes3 {
				err := health[n]
				switch {
				case !errors.Is(err, hypervisors.ErrUnreachable):
					t.Errorf("ZoneHealth[%s] = %v, want unreachable", n, err)
				case !strings.Contains(err.Error(), "down since ") || !strings.Contains(err.Error(), tt.reason):
					t.Errorf("ZoneHealth[%s] = %q, want down since ...: ...%s...", n, err, tt.reason)
				case strings.Contains(err.Error(), n) || strings.Contains(err.Error(), testSecret):
					t.Errorf("ZoneHealth[%s] = %q names the node or shows the secret", n, err)
				}
			}
			z, err := a.Observe(ctxT(t, 10*time.Second), "pve1")
			if err == nil || z.Status != observed.StatusUnknown {
				t.Errorf("Observe while down = %+v, %v; want unknown", z, err)
			}
			restored := time.Now()
			restore()
			waitZones(t, a, hypervisors.EventZoneUp, nodes3...)
			t.Logf("%s: every zone up %s after the API answered again", tt.name, time.Since(restored).Round(time.Millisecond))
			for n, err := range a.ZoneHealth() {
				if err != nil {
					t.Errorf("ZoneHealth[%s] after recovery = %v", n, err)
				}
			}
		})
	}
}

// TestZoneHealthOfAnOfflineNode: a node the cluster reports offline is
// down (and unknown to Observe) while the others stay up; its VMs push no
// events while it is offline; it comes back with an EventZoneUp.
func TestZoneHealthOfAnOfflineNode(t *testing.T) {
	e := newEnv(t, nil, polling(50*time.Millisecond))
	ownedVM(t, e, 500, "pve2", "m-0")
	ownedVM(t, e, 501, "pve1", "m-1")
	waitZones(t, e.a, hypervisors.EventZoneUp, nodes3...)
	e.sim.SetNodeStatus("pve2", "offline")
	ev := nextEvent(t, e.a, "zone-down of pve2", func(ev hypervisors.Event) bool { return ev.Kind != hypervisors.EventZoneUp })
	if diff := cmp.Diff(hypervisors.Event{Zone: "pve2", Kind: hypervisors.EventZoneDown, Detail: "offline"}, ev); diff != "" {
		t.Errorf("first event (-want +got):\n%s", diff)
	}
	health := e.a.ZoneHealth()
	if err := health["pve2"]; err == nil || !strings.Contains(err.Error(), `down since `) || !strings.HasSuffix(err.Error(), `: the cluster reports the node "offline"`) {
		t.Errorf("ZoneHealth[pve2] = %v", err)
	}
	if health["pve1"] != nil || health["pve3"] != nil {
		t.Errorf("ZoneHealth = %v, want pve1 and pve3 up", health)
	}
	if z, err := e.a.Observe(ctxT(t, 10*time.Second), "pve2"); err == nil || z.Status != observed.StatusUnknown {
		t.Errorf("Observe(pve2) = %+v, %v; want unknown", z, err)
	}
	if z, err := e.a.Observe(ctxT(t, 10*time.Second), "pve1"); err != nil || len(z.VMs) != 2 {
		t.Errorf("Observe(pve1) = %+v, %v; want its VM and the template", z, err)
	}
	// A change on an online node is the next event: the offline node's
	// VMs ("unknown" in the listing) pushed none.
	e.sim.SetPower(501, false)
	ev = nextEvent(t, e.a, "event", func(hypervisors.Event) bool { return true })
	if ev.VM != naming.VMName(testInst, "m-1", 1) || ev.Detail != "stopped" {
		t.Errorf("next event = %+v, want vm m-1 stopped", ev)
	}
	e.sim.SetNodeStatus("pve2", "online")
	ev = nextEvent(t, e.a, "event", func(hypervisors.Event) bool { return true })
	if diff := cmp.Diff(hypervisors.Event{Zone: "pve2", Kind: hypervisors.EventZoneUp}, ev); diff != "" {
		t.Errorf("event after the node is back (-want +got):\n%s", diff)
	}
	if err := e.a.ZoneHealth()["pve2"]; err != nil {
		t.Errorf("ZoneHealth[pve2] = %v after it came back", err)
	}
}

// TestCloseStopsAHungPoll: Close returns while a poll hangs, and closes
// the event channel.
func TestCloseStopsAHungPoll(t *testing.T) {
	e := newEnv(t, nil, func(c *Config) { c.APIURL = "" })
	hung := make(chan struct{})
	var once sync.Once
	e.sim.SetRequestHook(func(_ http.ResponseWriter, r *http.Request, _ func(http.ResponseWriter)) {
		once.Do(func() { close(hung) })
		<-r.Context().Done()
	})
	cfg := e.cfg
	cfg.APIURL, cfg.PollInterval, cfg.PollTimeout = e.srv.URL+"/api2/json", time.Second, time.Hour
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-hung
	closed := make(chan struct{})
	go func() { a.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(hangGuard):
		t.Fatal("Close blocked behind a hung poll")
	}
	for range a.Events() {
	}
	if err := a.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestPollConfigValidation: the poll interval is bounded when on.
func TestPollConfigValidation(t *testing.T) {
	e := newEnv(t, nil, func(c *Config) { c.APIURL = "" })
	tests := []struct {
		interval, timeout time.Duration
		wantErr           string
	}{
		{interval: -1},
		{interval: 0},
		{interval: time.Second, timeout: 2 * time.Second},
		{interval: time.Millisecond, wantErr: "poll interval 1ms is outside 10ms..1h0m0s"},
		{interval: 2 * time.Hour, wantErr: "poll interval 2h0m0s is outside"},
		{interval: time.Second, timeout: -time.Second, wantErr: "must not be negative"},
	}
	for _, tt := range tests {
		c := e.cfg
		c.APIURL, c.PollInterval, c.PollTimeout = e.srv.URL+"/api2/json", tt.interval, tt.timeout
		err := c.Validate()
		got := ""
		if err != nil {
			got = err.Error()
		}
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && !strings.Contains(got, tt.wantErr) {
			t.Errorf("interval %s timeout %s: Validate = %v, want %q", tt.interval, tt.timeout, err, tt.wantErr)
		}
	}
}

// TestListingSentBeforeAChangeIsNotCached: a listing in flight while the
// adapter changes a VM may predate the change; it must not serve later
// Observe calls (it did: the VM started by Start was observed stopped
// until the listing aged out, and with a poll every second one is
// nearly always in flight).
func TestListingSentBeforeAChangeIsNotCached(t *testing.T) {
	e := newEnv(t, nil, nil)
	if err := e.sim.AddVM(pvesim.VMSpec{VMID: 500, Node: "pve1", Name: "vm"}); err != nil {
		t.Fatal(err)
	}
	held, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	e.sim.SetRequestHook(func(w http.ResponseWriter, r *http.Request, serve func(http.ResponseWriter)) {
		serve(w) // the first listing's answer is made now, before the start
		if r.URL.Path == "/api2/json/cluster/resources" && first.CompareAndSwap(false, true) {
			close(held)
			<-release
		}
	})
	listed := make(chan error, 1)
	go func() { _, err := e.a.list(ctxT(t, 10*time.Second), false); listed <- err }()
	<-held
	if err := e.a.Start(ctxT(t, 10*time.Second), hypervisors.Target{Zone: "pve1", VMID: 500}); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-listed; err != nil {
		t.Fatal(err)
	}
	z, err := e.a.Observe(ctxT(t, 10*time.Second), "pve1")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range z.VMs {
		if v.VMID == 500 && v.Power != observed.PowerRunning {
			t.Errorf("Observe after Start shows vm 500 %s, want running", v.Power)
		}
	}
}
