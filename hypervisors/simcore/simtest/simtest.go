package simtest

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
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
	"github.com/bigfleet-vm/provider/naming"
	"github.com/bigfleet-vm/provider/observed"
)

// Inst is the installation of every marker the suite writes.
const Inst = "inst-1"

// Marker is the marker of machine in Inst, joined to cluster.
func Marker(machine, cluster string) observed.Marker {
	return observed.Marker{Installation: Inst, MachineID: machine, OpID: "op-" + machine, InstanceType: "kvm.small", Cluster: cluster}
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

// ErrIs compares an error to a wanted class (nil: no error).
func ErrIs(t *testing.T, what string, got, want error) {
	t.Helper()
	if want == nil && got != nil || want != nil && !errors.Is(got, want) {
		t.Fatalf("%s: error %v, want %v", what, got, want)
	}
}

// IgnoreAt ignores when a zone was observed.
var IgnoreAt = cmpopts.IgnoreFields(observed.Zone{}, "At", "VolumesAt")

// Sim is what the suite needs of a simulator.
type Sim interface {
	hypervisors.Hypervisor
	SetHook(simcore.Hook)
	SetFlaky(zone, op string, on bool) error
	Guest(hypervisors.Target) (simcore.GuestState, bool)
	RemoveVM(hypervisors.Target) error
}

// Shape is one simulator under test.
type Shape struct {
	// Open opens a simulator (from opts.State when set).
	Open func(opts simcore.Options) (Sim, error)
	// Create creates a stopped VM named name that carries m through the
	// simulator's own steps, as the executor would, and returns its
	// target.
	Create func(t *testing.T, h Sim, name string, m observed.Marker) hypervisors.Target
	// Place adds a running VM named name that carries m out of band and
	// returns its target.
	Place func(t *testing.T, h Sim, name string, m observed.Marker) hypervisors.Target
	// BlobPath is where the bootstrap hook reads the blob.
	BlobPath string
	// Bootstrap is the argv of the bootstrap hook joining cluster (the
	// marker's cluster when the argv does not name it).
	Bootstrap func(cluster string) []string
}

// Run runs the shared suite on the simulator s.
func Run(t *testing.T, s Shape) {
	for _, c := range []struct {
		name string
		run  func(*testing.T, Shape)
	}{
		{"GuestAgent", testGuestAgent},
		{"AgentDelay", testAgentDelay},
		{"ConformanceFaults", testConformanceFaults},
		{"FaultsOffIgnoresFaultClusters", testFaultsOffIgnoresFaultClusters},
		{"LatencyHonoursContext", testLatencyHonoursContext},
		{"ExecStartAndAnswerFaults", testExecStartAndAnswerFaults},
		{"SlowOKFinishesAfterTheCallerGaveUp", testSlowOKFinishesAfterTheCallerGaveUp},
		{"SetFlaky", testSetFlaky},
		{"Persistence", testPersistence},
		{"ReadCapacity", testReadCapacity},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t, s) })
	}
}

// open opens a simulator the test closes.
func (s Shape) open(t *testing.T, opts simcore.Options) Sim {
	t.Helper()
	h, err := s.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// built is a running VM ready for guest-agent work.
type built struct {
	h         Sim
	t         hypervisors.Target
	blobPath  string
	bootstrap []string
}

func (b built) guest() (simcore.GuestState, bool) { return b.h.Guest(b.t) }

// buildRunning creates, starts and marks (with cluster) one VM through the
// interface, as the executor would.
func buildRunning(t *testing.T, s Shape, opts simcore.Options, cluster string) built {
	t.Helper()
	ctx := context.Background()
	m := Marker("m-1", "")
	h := s.open(t, opts)
	b := built{h: h, t: s.Create(t, h, naming.VMName(Inst, "m-1", 0), m), blobPath: s.BlobPath, bootstrap: s.Bootstrap(cluster)}
	if err := b.h.Start(ctx, b.t); err != nil {
		t.Fatal(err)
	}
	m.Cluster = cluster
	if err := b.h.SetMarker(ctx, b.t, m); err != nil {
		t.Fatal(err)
	}
	return b
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

func testGuestAgent(t *testing.T, s Shape) {
	blob := []byte("#!/bin/sh\nkubeadm join --token secret\n")
	ctx := context.Background()
	b := buildRunning(t, s, simcore.Options{}, "c-1")
	steps := []struct {
		name string
		argv []string
		want execResult
	}{
		{"not ready before bootstrap", []string{simcore.DefaultReadyCommand}, execResult{1, "", "node not Ready\n"}},
		{"unknown command", []string{"/usr/bin/true"}, execResult{127, "", "/usr/bin/true: command not found\n"}},
		{"bootstrap without blob", b.bootstrap, execResult{1, "", b.bootstrap[0] + ": " + b.blobPath + ": No such file or directory\n"}},
		{"write blob", nil, execResult{}},
		{"bootstrap", b.bootstrap, execResult{0, "joined cluster c-1\n", ""}},
		{"ready", []string{simcore.DefaultReadyCommand}, execResult{0, "Ready\n", ""}},
		{"kubectl drain", []string{"/bin/sh", "-c", `kubectl drain "$(hostname)" --ignore-daemonsets`}, execResult{0, "node drained\n", ""}},
		{"drain hook", []string{simcore.DefaultDrainCommand}, execResult{0, "node drained\n", ""}},
	}
	for _, st := range steps {
		if st.argv == nil {
			ErrIs(t, st.name, b.h.AgentWriteFile(ctx, b.t, b.blobPath, blob, 0o600), nil)
			continue
		}
		got, err := exec(ctx, b.h, b.t, st.argv...)
		ErrIs(t, st.name, err, nil)
		if d := cmp.Diff(st.want, got); d != "" {
			t.Errorf("%s: (-want +got)\n%s", st.name, d)
		}
	}
	g, _ := b.guest()
	want := simcore.GuestState{
		Files:   map[string][]byte{b.blobPath: blob},
		Modes:   map[string]os.FileMode{b.blobPath: 0o600},
		Cluster: "c-1", Drains: 2, Cordoned: true,
		Bootstraps: []simcore.Bootstrap{{Cluster: "c-1", Argv: b.bootstrap, Blob: blob, BlobSize: len(blob)}},
		Starts:     simcore.Starts{Bootstrap: 2, Drain: 2, Ready: 2, Other: 1},
	}
	if d := cmp.Diff(want, g, cmpopts.IgnoreFields(simcore.Bootstrap{}, "BlobSHA256", "At")); d != "" {
		t.Errorf("guest (-want +got)\n%s", d)
	}
	ErrIs(t, "remove blob", b.h.AgentRemoveFile(ctx, b.t, b.blobPath), nil)
	ErrIs(t, "remove blob again", b.h.AgentRemoveFile(ctx, b.t, b.blobPath), nil)
	if g, _ := b.guest(); len(g.Files) != 0 {
		t.Errorf("files after remove: %v", g.Files)
	}
	ErrIs(t, "stop", b.h.Stop(ctx, b.t, time.Second), nil)
	ErrIs(t, "ping stopped", b.h.AgentPing(ctx, b.t), hypervisors.ErrAgentNotReady)
	_, err := exec(ctx, b.h, b.t, simcore.DefaultReadyCommand)
	ErrIs(t, "exec stopped", err, hypervisors.ErrAgentNotReady)
}

func testAgentDelay(t *testing.T, s Shape) {
	ctx := context.Background()
	clock := newClock()
	b := buildRunning(t, s, simcore.Options{AgentDelay: 30 * time.Second, Clock: clock.Now}, "")
	ErrIs(t, "ping at boot", b.h.AgentPing(ctx, b.t), hypervisors.ErrAgentNotReady)
	ErrIs(t, "write at boot", b.h.AgentWriteFile(ctx, b.t, "/x", nil, 0o600), hypervisors.ErrAgentNotReady)
	clock.Add(29 * time.Second)
	ErrIs(t, "ping at 29s", b.h.AgentPing(ctx, b.t), hypervisors.ErrAgentNotReady)
	clock.Add(time.Second)
	ErrIs(t, "ping at 30s", b.h.AgentPing(ctx, b.t), nil)
}

func testConformanceFaults(t *testing.T, s Shape) {
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
			cluster:   simcore.FaultError,
			bootstrap: execResult{1, "", "simulated bootstrap failure (fault-error)\n"},
			drain:     execResult{0, "node drained\n", ""},
			ready:     execResult{1, "", "node not Ready\n"},
		},
		{
			cluster:  simcore.FaultTimeout,
			ctxLimit: 20 * time.Millisecond,
			bootErr:  hypervisors.ErrOutcomeUnknown,
			drain:    execResult{0, "node drained\n", ""},
			ready:    execResult{1, "", "node not Ready\n"},
		},
		{
			cluster:  simcore.FaultSlowOK,
			ctxLimit: slow / 3,
			bootErr:  hypervisors.ErrOutcomeUnknown,
			drain:    execResult{0, "node drained\n", ""},
			ready:    execResult{1, "", "node not Ready\n"},
		},
		{
			cluster:   simcore.FaultSlowOK,
			ctxLimit:  10 * time.Second,
			bootstrap: execResult{0, "joined cluster fault-slow-ok\n", ""},
			drain:     execResult{0, "node drained\n", ""},
			ready:     execResult{0, "Ready\n", ""},
		},
		{
			cluster:   simcore.FaultDrainError,
			bootstrap: execResult{0, "joined cluster fault-drain-error\n", ""},
			drain:     execResult{1, "", "simulated drain failure (fault-drain-error)\n"},
			ready:     execResult{0, "Ready\n", ""},
		},
		{
			cluster:   simcore.FaultReadinessBlock,
			bootstrap: execResult{0, "joined cluster fault-readiness-block\n", ""},
			drain:     execResult{0, "node drained\n", ""},
			ready:     execResult{1, "", "node not Ready\n"},
		},
	}
	for _, c := range cases {
		t.Run(c.cluster+"/"+c.ctxLimit.String(), func(t *testing.T) {
			b := buildRunning(t, s, simcore.Options{Faults: true, SlowOK: slow}, c.cluster)
			ctx := context.Background()
			ErrIs(t, "write", b.h.AgentWriteFile(ctx, b.t, b.blobPath, blob, 0o600), nil)
			bctx := ctx
			if c.ctxLimit > 0 {
				var cancel context.CancelFunc
				bctx, cancel = context.WithTimeout(ctx, c.ctxLimit)
				defer cancel()
			}
			got, err := exec(bctx, b.h, b.t, s.Bootstrap(c.cluster)...)
			ErrIs(t, "bootstrap", err, c.bootErr)
			if d := cmp.Diff(c.bootstrap, got); d != "" {
				t.Errorf("bootstrap (-want +got)\n%s", d)
			}
			got, err = exec(ctx, b.h, b.t, simcore.DefaultReadyCommand)
			ErrIs(t, "ready", err, nil)
			if d := cmp.Diff(c.ready, got); d != "" {
				t.Errorf("ready (-want +got)\n%s", d)
			}
			got, err = exec(ctx, b.h, b.t, "kubectl", "drain", "node")
			ErrIs(t, "drain", err, nil)
			if d := cmp.Diff(c.drain, got); d != "" {
				t.Errorf("drain (-want +got)\n%s", d)
			}
		})
	}
}

func testFaultsOffIgnoresFaultClusters(t *testing.T, s Shape) {
	b := buildRunning(t, s, simcore.Options{}, simcore.FaultError)
	ctx := context.Background()
	ErrIs(t, "write", b.h.AgentWriteFile(ctx, b.t, b.blobPath, []byte("x"), 0o600), nil)
	got, err := exec(ctx, b.h, b.t, b.bootstrap...)
	ErrIs(t, "bootstrap", err, nil)
	if got.Code != 0 {
		t.Errorf("bootstrap with faults off: %+v", got)
	}
}

func testLatencyHonoursContext(t *testing.T, s Shape) {
	h := s.open(t, simcore.Options{Latency: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_, err := h.Observe(ctx, h.Zones()[0])
	ErrIs(t, "observe", err, context.DeadlineExceeded)
	cancelled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	err = s.open(t, simcore.Options{}).Start(cancelled, hypervisors.Target{Zone: "fake-a", Name: "x", VMID: 100})
	ErrIs(t, "dead ctx, no latency", err, context.Canceled)
}

// A guest command runs at most once per AgentExec, and the error says
// whether it may have run: a failure before the start leaves the guest
// untouched (the class is the hook's); a lost answer after the command
// ran is ErrOutcomeUnknown with its pid, and the command's effects stay.
func testExecStartAndAnswerFaults(t *testing.T, s Shape) {
	lost := errors.New("connection reset")
	tests := []struct {
		name       string
		hook       func() simcore.Hook
		wantErr    error
		wantStarts int
		wantJoined bool
	}{
		{name: "clean", wantStarts: 1, wantJoined: true},
		{name: "refused before start", hook: func() simcore.Hook { return simcore.FailN("AgentExec", 1, hypervisors.ErrAgentNotReady) }, wantErr: hypervisors.ErrAgentNotReady},
		{name: "answer lost", hook: func() simcore.Hook { return simcore.FailN(simcore.ExecAnswerOp, 1, lost) }, wantErr: hypervisors.ErrOutcomeUnknown, wantStarts: 1, wantJoined: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			b := buildRunning(t, s, simcore.Options{}, "c-1")
			ErrIs(t, "write", b.h.AgentWriteFile(ctx, b.t, b.blobPath, []byte("join"), 0o600), nil)
			if tc.hook != nil {
				b.h.SetHook(tc.hook())
			}
			_, err := b.h.AgentExec(ctx, b.t, b.bootstrap)
			ErrIs(t, "bootstrap", err, tc.wantErr)
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

// fault-slow-ok keeps running in the guest after the caller gave up, and
// finishes late (issue 8 item 13): the late success exists, so a test of
// "a late success is discarded" has something to discard.
func testSlowOKFinishesAfterTheCallerGaveUp(t *testing.T, s Shape) {
	b := buildRunning(t, s, simcore.Options{Faults: true, SlowOK: 50 * time.Millisecond}, simcore.FaultSlowOK)
	ctx := context.Background()
	ErrIs(t, "write", b.h.AgentWriteFile(ctx, b.t, b.blobPath, []byte("join"), 0o600), nil)
	short, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
	defer cancel()
	if _, err := exec(short, b.h, b.t, s.Bootstrap(simcore.FaultSlowOK)...); !errors.Is(err, hypervisors.ErrOutcomeUnknown) {
		t.Fatalf("bootstrap past its deadline: %v", err)
	}
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if g, _ := b.guest(); len(g.Bootstraps) == 1 {
			return
		}
	}
	t.Fatal("the slow hook never finished in the guest after the caller gave up")
}

// SetFlaky fails one kind of call on one zone, transiently, and nothing
// else; an unknown call or zone is refused.
func testSetFlaky(t *testing.T, s Shape) {
	ctx := context.Background()
	f := s.open(t, simcore.Options{Zones: []string{"a", "b"}})
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
}
