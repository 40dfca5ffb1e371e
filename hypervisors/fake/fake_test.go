package fake

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvespec"
	"github.com/bigfleet-vm/provider/naming"
	"github.com/bigfleet-vm/provider/observed"
)

const inst = "inst-1"

func marker(machine, cluster string) observed.Marker {
	return observed.Marker{Installation: inst, MachineID: machine, OpID: "op-" + machine, InstanceType: "kvm.small", Cluster: cluster}
}

// manualClock is a Clock tests move by hand.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *manualClock {
	return &manualClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// errIs compares an error to a wanted class (nil: no error).
func errIs(t *testing.T, what string, got, want error) {
	t.Helper()
	if want == nil && got != nil || want != nil && !errors.Is(got, want) {
		t.Fatalf("%s: error %v, want %v", what, got, want)
	}
}

var ignoreAt = cmpopts.IgnoreFields(observed.Zone{}, "At", "VolumesAt")

// built is a running VM ready for guest-agent work, in either shape.
type built struct {
	h         hypervisors.Hypervisor
	t         hypervisors.Target
	blobPath  string
	bootstrap []string
	guest     func() (GuestState, bool)
}

// buildRunning creates, starts and marks (with cluster) one VM through the
// interface, as the executor would.
func buildRunning(t *testing.T, shape string, opts Options, cluster string) built {
	t.Helper()
	ctx := context.Background()
	m := marker("m-1", "")
	name := naming.VMName(inst, "m-1", 0)
	var b built
	switch shape {
	case "libvirt":
		f := NewLibvirt(opts)
		zone := f.Zones()[0]
		mustLibvirtCreate(t, f, zone, name, m)
		b = built{h: f, t: hypervisors.Target{Zone: zone, Name: name}, blobPath: DefaultBlobPath,
			bootstrap: []string{DefaultBootstrapHook, cluster}}
		b.guest = func() (GuestState, bool) { return f.Guest(b.t) }
	case "proxmox":
		f := NewProxmox(opts)
		zone := f.Zones()[0]
		id, err := f.CloneVM(ctx, zone, pvespec.CloneSpec{Name: name, TemplateVMID: DefaultTemplateVMID, Marker: m})
		if err != nil {
			t.Fatal(err)
		}
		b = built{h: f, t: hypervisors.Target{Zone: zone, Name: name, VMID: id}, blobPath: DefaultBootstrapPath,
			bootstrap: []string{"/bin/sh", DefaultBootstrapPath}}
		if err := f.ConfigureVM(ctx, b.t, pvespec.SizeSpec{VCPU: 2, MemoryMiB: 4096, Marker: m}); err != nil {
			t.Fatal(err)
		}
		b.guest = func() (GuestState, bool) { return f.Guest(b.t) }
	}
	t.Cleanup(func() { b.h.Close() })
	if err := b.h.Start(ctx, b.t); err != nil {
		t.Fatal(err)
	}
	m.Cluster = cluster
	if err := b.h.SetMarker(ctx, b.t, m); err != nil {
		t.Fatal(err)
	}
	return b
}

func mustLibvirtCreate(t *testing.T, f *Libvirt, zone, name string, m observed.Marker) {
	t.Helper()
	ctx := context.Background()
	if err := f.CreateOverlay(ctx, zone, lvspec.OverlaySpec{Pool: DefaultPool, Name: naming.OverlayVolume(name), BaseImage: DefaultImage}); err != nil {
		t.Fatal(err)
	}
	if err := f.CreateSeed(ctx, zone, lvspec.SeedSpec{Pool: DefaultPool, Name: naming.SeedVolume(name), InstanceID: name, Hostname: name}); err != nil {
		t.Fatal(err)
	}
	if err := f.DefineDomain(ctx, zone, domainSpec(name, m)); err != nil {
		t.Fatal(err)
	}
}

func domainSpec(name string, m observed.Marker) lvspec.DomainSpec {
	return lvspec.DomainSpec{
		Name: name, VCPU: 2, MemoryMiB: 4096, DomainType: "kvm", Pool: DefaultPool,
		Overlay: naming.OverlayVolume(name), Seed: naming.SeedVolume(name), Network: DefaultNetwork, Marker: m,
	}
}

// execResult is ExecResult with strings, for readable diffs.
type execResult struct {
	Code           int
	Stdout, Stderr string
}

func exec(ctx context.Context, h hypervisors.Hypervisor, t hypervisors.Target, argv ...string) (execResult, error) {
	r, err := h.AgentExec(ctx, t, argv)
	return execResult{r.ExitCode, string(r.Stdout), string(r.Stderr)}, err
}

func TestGuestAgent(t *testing.T) {
	blob := []byte("#!/bin/sh\nkubeadm join --token secret\n")
	for _, shape := range []string{"libvirt", "proxmox"} {
		t.Run(string(shape), func(t *testing.T) {
			ctx := context.Background()
			b := buildRunning(t, shape, Options{}, "c-1")
			steps := []struct {
				name string
				argv []string
				want execResult
			}{
				{"not ready before bootstrap", []string{DefaultReadyCommand}, execResult{1, "", "node not Ready\n"}},
				{"unknown command", []string{"/usr/bin/true"}, execResult{127, "", "/usr/bin/true: command not found\n"}},
				{"bootstrap without blob", b.bootstrap, execResult{1, "", b.bootstrap[0] + ": " + b.blobPath + ": No such file or directory\n"}},
				{"write blob", nil, execResult{}},
				{"bootstrap", b.bootstrap, execResult{0, "joined cluster c-1\n", ""}},
				{"ready", []string{DefaultReadyCommand}, execResult{0, "Ready\n", ""}},
				{"kubectl drain", []string{"/bin/sh", "-c", `kubectl drain "$(hostname)" --ignore-daemonsets`}, execResult{0, "node drained\n", ""}},
				{"drain hook", []string{DefaultDrainCommand}, execResult{0, "node drained\n", ""}},
			}
			for _, s := range steps {
				if s.argv == nil {
					errIs(t, s.name, b.h.AgentWriteFile(ctx, b.t, b.blobPath, blob, 0o600), nil)
					continue
				}
				got, err := exec(ctx, b.h, b.t, s.argv...)
				errIs(t, s.name, err, nil)
				if d := cmp.Diff(s.want, got); d != "" {
					t.Errorf("%s: (-want +got)\n%s", s.name, d)
				}
			}
			g, _ := b.guest()
			want := GuestState{
				Files:   map[string][]byte{b.blobPath: blob},
				Modes:   map[string]os.FileMode{b.blobPath: 0o600},
				Cluster: "c-1", Drains: 2, Cordoned: true,
				Bootstraps: []Bootstrap{{Cluster: "c-1", Argv: b.bootstrap, Blob: blob, BlobSize: len(blob)}},
				Starts:     Starts{Bootstrap: 2, Drain: 2, Ready: 2, Other: 1},
			}
			if d := cmp.Diff(want, g, cmpopts.IgnoreFields(Bootstrap{}, "BlobSHA256", "At")); d != "" {
				t.Errorf("guest (-want +got)\n%s", d)
			}
			errIs(t, "remove blob", b.h.AgentRemoveFile(ctx, b.t, b.blobPath), nil)
			errIs(t, "remove blob again", b.h.AgentRemoveFile(ctx, b.t, b.blobPath), nil)
			if g, _ := b.guest(); len(g.Files) != 0 {
				t.Errorf("files after remove: %v", g.Files)
			}
			errIs(t, "stop", b.h.Stop(ctx, b.t, time.Second), nil)
			errIs(t, "ping stopped", b.h.AgentPing(ctx, b.t), hypervisors.ErrAgentNotReady)
			_, err := exec(ctx, b.h, b.t, DefaultReadyCommand)
			errIs(t, "exec stopped", err, hypervisors.ErrAgentNotReady)
		})
	}
}

func TestAgentDelay(t *testing.T) {
	for _, shape := range []string{"libvirt", "proxmox"} {
		t.Run(string(shape), func(t *testing.T) {
			ctx := context.Background()
			clock := newClock()
			b := buildRunning(t, shape, Options{AgentDelay: 30 * time.Second, Clock: clock.Now}, "")
			errIs(t, "ping at boot", b.h.AgentPing(ctx, b.t), hypervisors.ErrAgentNotReady)
			errIs(t, "write at boot", b.h.AgentWriteFile(ctx, b.t, "/x", nil, 0o600), hypervisors.ErrAgentNotReady)
			clock.Add(29 * time.Second)
			errIs(t, "ping at 29s", b.h.AgentPing(ctx, b.t), hypervisors.ErrAgentNotReady)
			clock.Add(time.Second)
			errIs(t, "ping at 30s", b.h.AgentPing(ctx, b.t), nil)
		})
	}
}

func TestConformanceFaults(t *testing.T) {
	blob := []byte("join")
	// slow leaves room for a loaded machine between the bootstrap giving up
	// (slow/3) and the readiness check that must still see it unjoined.
	slow := 300 * time.Millisecond
	cases := []struct {
		cluster   string
		ctxLimit  time.Duration
		bootstrap execResult
		bootErr   error
		drain     execResult
		ready     execResult
	}{
		{
			cluster:   "c-ok",
			bootstrap: execResult{0, "joined cluster c-ok\n", ""},
			drain:     execResult{0, "node drained\n", ""},
			ready:     execResult{0, "Ready\n", ""},
		},
		{
			cluster:   FaultError,
			bootstrap: execResult{1, "", "simulated bootstrap failure (fault-error)\n"},
			drain:     execResult{0, "node drained\n", ""},
			ready:     execResult{1, "", "node not Ready\n"},
		},
		{
			cluster:  FaultTimeout,
			ctxLimit: 20 * time.Millisecond,
			bootErr:  hypervisors.ErrOutcomeUnknown,
			drain:    execResult{0, "node drained\n", ""},
			ready:    execResult{1, "", "node not Ready\n"},
		},
		{
			cluster:  FaultSlowOK,
			ctxLimit: slow / 3,
			bootErr:  hypervisors.ErrOutcomeUnknown,
			drain:    execResult{0, "node drained\n", ""},
			ready:    execResult{1, "", "node not Ready\n"},
		},
		{
			cluster:   FaultSlowOK,
			ctxLimit:  10 * time.Second,
			bootstrap: execResult{0, "joined cluster fault-slow-ok\n", ""},
			drain:     execResult{0, "node drained\n", ""},
			ready:     execResult{0, "Ready\n", ""},
		},
		{
			cluster:   FaultDrainError,
			bootstrap: execResult{0, "joined cluster fault-drain-error\n", ""},
			drain:     execResult{1, "", "simulated drain failure (fault-drain-error)\n"},
			ready:     execResult{0, "Ready\n", ""},
		},
		{
			cluster:   FaultReadinessBlock,
			bootstrap: execResult{0, "joined cluster fault-readiness-block\n", ""},
			drain:     execResult{0, "node drained\n", ""},
			ready:     execResult{1, "", "node not Ready\n"},
		},
	}
	for _, shape := range []string{"libvirt", "proxmox"} {
		for _, c := range cases {
			t.Run(string(shape)+"/"+c.cluster+"/"+c.ctxLimit.String(), func(t *testing.T) {
				b := buildRunning(t, shape, Options{Faults: true, SlowOK: slow}, c.cluster)
				ctx := context.Background()
				errIs(t, "write", b.h.AgentWriteFile(ctx, b.t, b.blobPath, blob, 0o600), nil)
				bctx := ctx
				if c.ctxLimit > 0 {
					var cancel context.CancelFunc
					bctx, cancel = context.WithTimeout(ctx, c.ctxLimit)
					defer cancel()
				}
				argv := append([]string(nil), b.bootstrap...)
				if shape == "libvirt" {
					argv[1] = c.cluster
				}
				got, err := exec(bctx, b.h, b.t, argv...)
				errIs(t, "bootstrap", err, c.bootErr)
				if d := cmp.Diff(c.bootstrap, got); d != "" {
					t.Errorf("bootstrap (-want +got)\n%s", d)
				}
				got, err = exec(ctx, b.h, b.t, DefaultReadyCommand)
				errIs(t, "ready", err, nil)
				if d := cmp.Diff(c.ready, got); d != "" {
					t.Errorf("ready (-want +got)\n%s", d)
				}
				got, err = exec(ctx, b.h, b.t, "kubectl", "drain", "node")
				errIs(t, "drain", err, nil)
				if d := cmp.Diff(c.drain, got); d != "" {
					t.Errorf("drain (-want +got)\n%s", d)
				}
			})
		}
	}
}

func TestFaultsOffIgnoresFaultClusters(t *testing.T) {
	b := buildRunning(t, "libvirt", Options{}, FaultError)
	ctx := context.Background()
	errIs(t, "write", b.h.AgentWriteFile(ctx, b.t, b.blobPath, []byte("x"), 0o600), nil)
	got, err := exec(ctx, b.h, b.t, b.bootstrap...)
	errIs(t, "bootstrap", err, nil)
	if got.Code != 0 {
		t.Errorf("bootstrap with faults off: %+v", got)
	}
}

// Each simulator offers the steps of its own shape and not the other's,
// so the executor answers a step of the wrong shape with ErrUnsupported.
func TestShapeSteps(t *testing.T) {
	for _, h := range []hypervisors.Hypervisor{NewLibvirt(Options{}), NewProxmox(Options{})} {
		defer h.Close()
		_, lv := hypervisors.Find[lvspec.Steps](h)
		_, px := hypervisors.Find[pvespec.Steps](h)
		want := map[string]bool{"libvirt": shapeOf(h) == "libvirt", "proxmox": shapeOf(h) == "proxmox"}
		got := map[string]bool{"libvirt": lv, "proxmox": px}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("%s simulator: steps offered (-want +got):\n%s", shapeOf(h), d)
		}
	}
}

// shapeOf names the simulator h is.
func shapeOf(h hypervisors.Hypervisor) string {
	if _, ok := h.(*Libvirt); ok {
		return "libvirt"
	}
	return "proxmox"
}

func TestLatencyHonoursContext(t *testing.T) {
	for _, h := range []hypervisors.Hypervisor{
		NewLibvirt(Options{Latency: time.Hour}),
		NewProxmox(Options{Latency: time.Hour}),
	} {
		t.Run(shapeOf(h), func(t *testing.T) {
			defer h.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
			defer cancel()
			_, err := h.Observe(ctx, h.Zones()[0])
			errIs(t, "observe", err, context.DeadlineExceeded)
			cancelled, cancel2 := context.WithCancel(context.Background())
			cancel2()
			err = NewLibvirt(Options{}).Start(cancelled, hypervisors.Target{Zone: "fake-a", Name: "x"})
			errIs(t, "dead ctx, no latency", err, context.Canceled)
		})
	}
}

func TestHooksAndReachability(t *testing.T) {
	transient := errors.New("boom")
	ctx := context.Background()
	var seen []Call
	var mu sync.Mutex
	record := func(_ context.Context, c Call) error {
		mu.Lock()
		seen = append(seen, c)
		mu.Unlock()
		return nil
	}
	f := NewLibvirt(Options{Zones: []string{"rack1", "rack2"}, Hook: Chain(record, FailN("Observe", 2, transient))})
	defer f.Close()
	for i, want := range []error{transient, transient, nil, nil} {
		_, err := f.Observe(ctx, "rack1")
		errIs(t, "observe", err, want)
		_ = i
	}
	f.SetUnreachable("rack2", true)
	_, err := f.Observe(ctx, "rack2")
	errIs(t, "observe unreachable", err, hypervisors.ErrUnreachable)
	errIs(t, "start unreachable", f.Start(ctx, hypervisors.Target{Zone: "rack2", Name: "x"}), hypervisors.ErrUnreachable)
	if d := cmp.Diff(map[string]error{"rack1": nil, "rack2": hypervisors.ErrUnreachable}, f.ZoneHealth(), cmpopts.EquateErrors()); d != "" {
		t.Errorf("health (-want +got)\n%s", d)
	}
	f.SetUnreachable("rack2", false)
	_, err = f.Observe(ctx, "rack2")
	errIs(t, "observe reachable again", err, nil)

	f.SetHook(func(_ context.Context, c Call) error {
		if c.Op == "DefineDomain" && c.Target.Name == "bf-x" {
			return hypervisors.ErrPermission
		}
		return nil
	})
	errIs(t, "hooked define", f.DefineDomain(ctx, "rack1", domainSpec("bf-x", marker("m", ""))), hypervisors.ErrPermission)
	if d := cmp.Diff(map[string]int{"Observe": 6, "Start": 1, "DefineDomain": 1}, f.Calls()); d != "" {
		t.Errorf("calls (-want +got)\n%s", d)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []Call{
		{Op: "Observe", Zone: "rack1", Target: hypervisors.Target{Zone: "rack1"}},
		{Op: "Observe", Zone: "rack1", Target: hypervisors.Target{Zone: "rack1"}},
		{Op: "Observe", Zone: "rack1", Target: hypervisors.Target{Zone: "rack1"}},
		{Op: "Observe", Zone: "rack1", Target: hypervisors.Target{Zone: "rack1"}},
		{Op: "Observe", Zone: "rack2", Target: hypervisors.Target{Zone: "rack2"}},
		{Op: "Start", Zone: "rack2", Target: hypervisors.Target{Zone: "rack2", Name: "x"}},
		{Op: "Observe", Zone: "rack2", Target: hypervisors.Target{Zone: "rack2"}},
	}
	if d := cmp.Diff(want, seen); d != "" {
		t.Errorf("hook saw (-want +got)\n%s", d)
	}
	f.ResetCalls()
	if len(f.Calls()) != 0 {
		t.Errorf("calls after reset: %v", f.Calls())
	}
}

// A guest command runs at most once per AgentExec, and the error says
// whether it may have run: a failure before the start leaves the guest
// untouched (the class is the hook's); a lost answer after the command
// ran is ErrOutcomeUnknown with its pid, and the command's effects stay.
func TestExecStartAndAnswerFaults(t *testing.T) {
	lost := errors.New("connection reset")
	tests := []struct {
		name       string
		hook       func() Hook
		wantErr    error
		wantStarts int
		wantJoined bool
	}{
		{name: "clean", wantStarts: 1, wantJoined: true},
		{name: "refused before start", hook: func() Hook { return FailN("AgentExec", 1, hypervisors.ErrAgentNotReady) }, wantErr: hypervisors.ErrAgentNotReady},
		{name: "answer lost", hook: func() Hook { return FailN(ExecAnswerOp, 1, lost) }, wantErr: hypervisors.ErrOutcomeUnknown, wantStarts: 1, wantJoined: true},
	}
	for _, shape := range []string{"libvirt", "proxmox"} {
		for _, tc := range tests {
			t.Run(string(shape)+"/"+tc.name, func(t *testing.T) {
				ctx := context.Background()
				b := buildRunning(t, shape, Options{}, "c-1")
				errIs(t, "write", b.h.AgentWriteFile(ctx, b.t, b.blobPath, []byte("join"), 0o600), nil)
				if tc.hook != nil {
					b.h.(interface{ SetHook(Hook) }).SetHook(tc.hook())
				}
				_, err := b.h.AgentExec(ctx, b.t, b.bootstrap)
				errIs(t, "bootstrap", err, tc.wantErr)
				if hypervisors.Retryable(err) == errors.Is(err, hypervisors.ErrOutcomeUnknown) && err != nil {
					t.Errorf("Retryable(%v) = %v", err, hypervisors.Retryable(err))
				}
				var u *hypervisors.UnknownOutcomeError
				if errors.As(err, &u) && (u.PID == 0 || !strings.Contains(err.Error(), "started as pid")) {
					t.Errorf("unknown outcome without its pid: %v", err)
				}
				g, _ := b.guest()
				if g.Starts.Bootstrap != tc.wantStarts || (g.Cluster == "c-1") != tc.wantJoined {
					t.Errorf("guest after exec: %d starts, cluster %q; want %d starts, joined %v", g.Starts.Bootstrap, g.Cluster, tc.wantStarts, tc.wantJoined)
				}
			})
		}
	}
}

// fault-slow-ok keeps running in the guest after the caller gave up, and
// finishes late (issue 8 item 13): the late success exists, so a test of
// "a late success is discarded" has something to discard.
func TestSlowOKFinishesAfterTheCallerGaveUp(t *testing.T) {
	for _, shape := range []string{"libvirt", "proxmox"} {
		t.Run(string(shape), func(t *testing.T) {
			b := buildRunning(t, shape, Options{Faults: true, SlowOK: 50 * time.Millisecond}, FaultSlowOK)
			ctx := context.Background()
			errIs(t, "write", b.h.AgentWriteFile(ctx, b.t, b.blobPath, []byte("join"), 0o600), nil)
			short, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
			defer cancel()
			argv := append([]string(nil), b.bootstrap...)
			if shape == "libvirt" {
				argv[1] = FaultSlowOK
			}
			if _, err := exec(short, b.h, b.t, argv...); !errors.Is(err, hypervisors.ErrOutcomeUnknown) {
				t.Fatalf("bootstrap past its deadline: %v", err)
			}
			guest := b.h.(interface {
				Guest(hypervisors.Target) (GuestState, bool)
			})
			for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
				if g, _ := guest.Guest(b.t); len(g.Bootstraps) == 1 {
					return
				}
			}
			t.Fatal("the slow hook never finished in the guest after the caller gave up")
		})
	}
}

// SetFlaky fails one kind of call on one zone, transiently, and nothing
// else; an unknown call or zone is refused.
func TestSetFlaky(t *testing.T) {
	ctx := context.Background()
	for _, f := range []interface {
		hypervisors.Hypervisor
		SetFlaky(zone, op string, on bool) error
	}{NewLibvirt(Options{Zones: []string{"a", "b"}}), NewProxmox(Options{Zones: []string{"a", "b"}})} {
		t.Run(shapeOf(f), func(t *testing.T) {
			if err := f.SetFlaky("a", "Start", true); err != nil {
				t.Fatal(err)
			}
			if err := f.Start(ctx, hypervisors.Target{Zone: "a", Name: "x", VMID: 100}); !errors.Is(err, hypervisors.ErrTransient) {
				t.Errorf("Start on the flaky zone: %v, want ErrTransient", err)
			}
			if err := f.Start(ctx, hypervisors.Target{Zone: "b", Name: "x", VMID: 100}); errors.Is(err, hypervisors.ErrTransient) {
				t.Errorf("Start on the other zone: %v", err)
			}
			if _, err := f.Observe(ctx, "a"); err != nil {
				t.Errorf("Observe on the flaky zone: %v", err)
			}
			if err := f.SetFlaky("a", "Start", false); err != nil {
				t.Fatal(err)
			}
			if err := f.Start(ctx, hypervisors.Target{Zone: "a", Name: "x", VMID: 100}); errors.Is(err, hypervisors.ErrTransient) {
				t.Errorf("Start after SetFlaky off: %v", err)
			}
			for _, bad := range [][2]string{{"a", "Reboot"}, {"c", "Start"}} {
				if err := f.SetFlaky(bad[0], bad[1], true); !errors.Is(err, hypervisors.ErrInvalid) {
					t.Errorf("SetFlaky(%q, %q): %v, want ErrInvalid", bad[0], bad[1], err)
				}
			}
		})
	}
}
