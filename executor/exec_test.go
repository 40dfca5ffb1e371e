package executor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/guest"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/libvirtsim"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/proxmoxsim"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvespec"
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/planner"
)

// failNth fails the n-th hook call (counting every op, from 0) with err
// and returns the calls seen so far.
func failNth(n int, err error) (simcore.Hook, func() []simcore.Call) {
	var mu sync.Mutex
	var seen []simcore.Call
	return func(_ context.Context, c simcore.Call) error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, c)
			if len(seen)-1 == n {
				return err
			}
			return nil
		}, func() []simcore.Call {
			mu.Lock()
			defer mu.Unlock()
			return append([]simcore.Call(nil), seen...)
		}
}

// execStarts counts ExecStarting calls per step.
type execStarts struct {
	mu    sync.Mutex
	calls map[string]int
	err   error
}

func (s *execStarts) hook(_ context.Context, machine, opID, stepID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.calls == nil {
		s.calls = map[string]int{}
	}
	s.calls[machine+"/"+opID+"/"+stepID]++
	return s.err
}

func (s *execStarts) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.calls {
		n += c
	}
	return n
}

// guestVM is a running VM of either fake shape, bound to cluster c-1,
// with its bootstrap step.
type guestVM struct {
	hv        hypervisors.Hypervisor
	setHook   func(simcore.Hook)
	guest     func() simcore.GuestState
	bootstrap planner.Step
	drain     planner.Step
	ready     planner.Step
}

func newGuestVM(t *testing.T, shape string, opts simcore.Options) guestVM {
	t.Helper()
	ctx := context.Background()
	opts.Zones = []string{"z"}
	mk := observed.Marker{Installation: inst, MachineID: "m", Cluster: "c-1"}
	var g guestVM
	var tg hypervisors.Target
	switch shape {
	case "libvirt":
		hv := libvirtsim.NewLibvirt(libvirtsim.Options{Options: opts})
		if err := hv.AddOwnedVM("z", "vm", mk, observed.PowerRunning); err != nil {
			t.Fatal(err)
		}
		tg = hypervisors.Target{Zone: "z", Name: "vm"}
		g = guestVM{hv: hv, setHook: hv.SetHook, guest: func() simcore.GuestState { s, _ := hv.Guest(tg); return s }}
		g.bootstrap = step(planner.ActionExecBootstrap, tg, planner.Params{Exec: []string{libvirt.HookPath, "c-1"}, BlobPath: libvirt.BlobPath})
	case "proxmox":
		hv := proxmoxsim.NewProxmox(proxmoxsim.Options{Options: opts})
		id, err := hv.CloneVM(ctx, "z", pvespec.CloneSpec{Name: "vm", TemplateVMID: proxmoxsim.DefaultTemplateVMID, Marker: mk})
		if err != nil {
			t.Fatal(err)
		}
		tg = hypervisors.Target{Zone: "z", Name: "vm", VMID: id}
		if err := hv.Start(ctx, tg); err != nil {
			t.Fatal(err)
		}
		g = guestVM{hv: hv, setHook: hv.SetHook, guest: func() simcore.GuestState { s, _ := hv.Guest(tg); return s }}
		g.bootstrap = step(planner.ActionExecBootstrap, tg, planner.Params{Exec: []string{"/bin/sh", simcore.DefaultBootstrapPath}, BlobPath: simcore.DefaultBootstrapPath})
	}
	g.drain = step(planner.ActionExecDrain, tg, planner.Params{Exec: planner.DrainArgv(30)})
	g.ready = step(planner.ActionExecReady, tg, planner.Params{Exec: []string{simcore.DefaultReadyCommand}})
	t.Cleanup(func() { g.hv.Close() })
	return g
}

var shapes = []string{"libvirt", "proxmox"}

// A fault at every call of the bootstrap sequence, the simulated agent's
// wire included (deliver the guest-op wrapper, stage the blob, run the
// wrapper and poll it, its answer, remove the blob): the hook starts at
// most once, and every fault after it may have started is recovered from
// the guest's record of it, so the step succeeds; only a terminal error
// before anything started fails it. The blob never stays.
func TestBootstrapRunsAtMostOnceUnderFaults(t *testing.T) {
	blob := []byte("kubeadm join --token abcdef.0123456789abcdef")
	for _, shape := range shapes {
		clean := newGuestVM(t, shape, simcore.Options{})
		hook, seenClean := failNth(-1, nil)
		clean.setHook(hook)
		if _, err := newExec(clean.hv, blob).Run(context.Background(), planner.Change{Machine: "m", Steps: []planner.Step{clean.bootstrap}}, "op"); err != nil {
			t.Fatalf("%s: clean run: %v", shape, err)
		}
		sequence := seenClean()
		// phase says where each call is: staging the blob (as the Run
		// starts), delivering the wrapper, running the wrapper (from its
		// AgentExec on), or removing the blob.
		phase := make([]string, len(sequence))
		cur, writes := "", 0
		for i, c := range sequence {
			switch {
			case c.Op == "AgentWriteFile":
				writes++
				cur = map[int]string{1: "stage", 2: "deliver"}[writes]
			case c.Op == "AgentExec" && len(c.Argv) > 1 && c.Argv[1] == guest.WrapperPath:
				cur = "hook"
			case c.Op == "AgentExec" && len(c.Argv) > 2 && c.Argv[2] == guest.UnstageScript:
				cur = "remove"
			}
			phase[i] = cur
		}
		if cur != "remove" || writes != 2 {
			t.Fatalf("%s: clean sequence %v", shape, sequence)
		}
		for n, c := range sequence {
			for _, fault := range []error{hypervisors.ErrTransient, hypervisors.ErrAgentNotReady, errors.New("connection reset by peer")} {
				t.Run(fmt.Sprintf("%s/%02d-%s-%s/%v", shape, n, phase[n], c.Op, fault), func(t *testing.T) {
					g := newGuestVM(t, shape, simcore.Options{})
					hook, _ := failNth(n, fault)
					g.setHook(hook)
					starts := &execStarts{}
					ex := newExec(g.hv, blob)
					ex.o.ExecStarting = starts.hook
					_, err := ex.Run(context.Background(), planner.Change{Machine: "m", Steps: []planner.Step{g.bootstrap}}, "op")
					st := g.guest()
					if st.Starts.Bootstrap > 1 {
						t.Fatalf("the hook started %d times", st.Starts.Bootstrap)
					}
					for p := range st.Files {
						if p == g.bootstrap.Params.BlobPath || strings.HasPrefix(p, "/run/bigfleet/stage/") {
							t.Errorf("the blob stayed in the guest at %s", p)
						}
					}
					// A request that fails before it reached the guest
					// (the agent method, a start request, a file write)
					// with a terminal class stops the step there; a lost
					// answer or status (the helpers' and the wrapper's)
					// is asked again and recovered. The blob's staging as
					// the Run starts is done again by the step if it failed.
					terminal := !hypervisors.Retryable(fault) && (phase[n] == "deliver" || phase[n] == "hook") &&
						(c.Op == "AgentWriteFile" || c.Op == "AgentExec" || c.Op == simcore.AgentExecOp || c.Op == simcore.AgentWriteOp)
					wantStarting := 1
					if terminal && phase[n] == "deliver" {
						wantStarting = 0
					}
					if got := starts.count(); got != wantStarting {
						t.Errorf("ExecStarting called %d times, want %d", got, wantStarting)
					}
					if terminal {
						if err == nil || st.Starts.Bootstrap != 0 || errors.Is(err, hypervisors.ErrOutcomeUnknown) {
							t.Errorf("err = %v with %d starts; want the terminal error and no start", err, st.Starts.Bootstrap)
						}
						return
					}
					if err != nil {
						t.Fatalf("a %v at %s should be retried or recovered from the guest's record: %v", fault, c.Op, err)
					}
					if st.Starts.Bootstrap != 1 || len(st.Bootstraps) != 1 {
						t.Errorf("hook starts = %d, bootstraps = %d; want 1 and 1", st.Starts.Bootstrap, len(st.Bootstraps))
					}
				})
			}
		}
	}
}

// The drain runs at most once: a lost answer is recovered from the
// guest's record, a refusal before the start is retried.
func TestDrainRunsAtMostOnce(t *testing.T) {
	tests := []struct {
		name       string
		hook       func() simcore.Hook
		wantErr    error
		wantDrains int
	}{
		{name: "clean", wantDrains: 1},
		{name: "agent not ready twice", hook: func() simcore.Hook { return simcore.FailN("AgentExec", 2, hypervisors.ErrAgentNotReady) }, wantDrains: 1},
		{name: "answer lost", hook: func() simcore.Hook { return simcore.FailN(simcore.ExecAnswerOp, 1, hypervisors.ErrTransient) },
			wantDrains: 1},
		{name: "permission", hook: func() simcore.Hook { return simcore.FailN("AgentExec", 1, hypervisors.ErrPermission) },
			wantErr: hypervisors.ErrPermission},
	}
	for _, shape := range shapes {
		for _, tc := range tests {
			t.Run(string(shape)+"/"+tc.name, func(t *testing.T) {
				g := newGuestVM(t, shape, simcore.Options{})
				if tc.hook != nil {
					g.setHook(tc.hook())
				}
				starts := &execStarts{}
				ex := newExec(g.hv, nil)
				ex.o.ExecStarting = starts.hook
				_, err := ex.Run(context.Background(), planner.Change{Machine: "m", Steps: []planner.Step{g.drain}}, "op")
				if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				if st := g.guest(); st.Starts.Drain != tc.wantDrains {
					t.Errorf("drain started %d times, want %d", st.Starts.Drain, tc.wantDrains)
				}
				if n := starts.count(); n != 1 {
					t.Errorf("ExecStarting called %d times, want 1", n)
				}
			})
		}
	}
}

// ExecStarting refusing sends nothing to run and fails the step with its
// error; the staged blob is removed.
func TestExecStartingRefusalSendsNothing(t *testing.T) {
	for _, shape := range shapes {
		t.Run(string(shape), func(t *testing.T) {
			g := newGuestVM(t, shape, simcore.Options{})
			refused := &hypervisors.UnknownOutcomeError{Command: "bootstrap hook", Why: "a previous run of this operation sent it"}
			starts := &execStarts{err: refused}
			ex := newExec(g.hv, []byte("blob"))
			ex.o.ExecStarting = starts.hook
			_, err := ex.Run(context.Background(), planner.Change{Machine: "m", Steps: []planner.Step{g.bootstrap}}, "op-9")
			if !errors.Is(err, hypervisors.ErrOutcomeUnknown) {
				t.Fatalf("err = %v, want the refusal", err)
			}
			st := g.guest()
			if st.Starts.Bootstrap != 0 {
				t.Errorf("the hook started %d times after a refusal", st.Starts.Bootstrap)
			}
			for p := range st.Files {
				if p == g.bootstrap.Params.BlobPath || strings.HasPrefix(p, "/run/bigfleet/stage/") {
					t.Errorf("the blob stayed in the guest at %s", p)
				}
			}
			if n := starts.calls["m/op-9/"+g.bootstrap.ID]; n != 1 {
				t.Errorf("ExecStarting calls = %v, want one for the step", starts.calls)
			}
		})
	}
}

// A hook still running at the deadline is an unknown outcome that names
// its pid; it is not sent again.
func TestBootstrapDeadlineIsUnknownOutcome(t *testing.T) {
	for _, shape := range shapes {
		t.Run(string(shape), func(t *testing.T) {
			g := newGuestVM(t, shape, simcore.Options{Faults: true})
			if err := g.hv.SetMarker(context.Background(), g.bootstrap.Target, observed.Marker{Installation: inst, MachineID: "m", Cluster: simcore.FaultTimeout}); err != nil {
				t.Fatal(err)
			}
			if shape == "libvirt" {
				g.bootstrap.Params.Exec[1] = simcore.FaultTimeout
			}
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			_, err := newExec(g.hv, []byte("blob")).Run(ctx, planner.Change{Machine: "m", Steps: []planner.Step{g.bootstrap}}, "op")
			var u *hypervisors.UnknownOutcomeError
			if !errors.As(err, &u) || u.PID == 0 || hypervisors.Retryable(err) {
				t.Fatalf("err = %v, want an unknown outcome with a pid", err)
			}
			if st := g.guest(); st.Starts.Bootstrap != 1 {
				t.Errorf("the hook started %d times, want 1", st.Starts.Bootstrap)
			}
		})
	}
}

// A readiness probe whose answer is lost does not end the gate: the
// probe is read-only, runs under the wrapper one at a time, and the next
// one answers.
func TestReadinessProbeLostAnswerDoesNotEndGate(t *testing.T) {
	for _, shape := range shapes {
		t.Run(string(shape), func(t *testing.T) {
			g := newGuestVM(t, shape, simcore.Options{})
			ex := newExec(g.hv, []byte("blob"))
			if _, err := ex.Run(context.Background(), planner.Change{Machine: "m", Steps: []planner.Step{g.bootstrap}}, "op-1"); err != nil {
				t.Fatal(err)
			}
			g.setHook(simcore.FailN(simcore.ExecAnswerOp, 1, hypervisors.ErrTransient))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := ex.Run(ctx, planner.Change{Machine: "m", Steps: []planner.Step{g.ready}}, "op-1"); err != nil {
				t.Fatalf("gate: %v", err)
			}
			if st := g.guest(); st.Starts.Ready < 1 || st.Starts.Ready > 2 {
				t.Errorf("probe started %d times, want 1 or 2", st.Starts.Ready)
			}
		})
	}
}

// The blob is staged in the guest as the Run starts, not after the steps
// ahead of the hook: the bind step here only passes once the staged blob
// is in the guest. A Run whose earlier step then fails removes it.
func TestBlobStagedAsRunStarts(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprint("bind fails=", fail), func(t *testing.T) {
			hv := libvirtsim.NewLibvirt(libvirtsim.Options{Options: simcore.Options{Zones: []string{"z"}}})
			tg := owned(t, hv, "vm")
			staged := guest.StagePath(opKey("op-1", planner.ActionExecBootstrap))
			hv.SetHook(func(ctx context.Context, c simcore.Call) error {
				if c.Op != "SetMarker" {
					return nil
				}
				for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
					if _, ok := hv.GuestFile(tg, staged); ok {
						if fail {
							return fmt.Errorf("bind refused: %w", hypervisors.ErrPermission)
						}
						return nil
					}
				}
				return fmt.Errorf("the blob was not staged before bind: %w", hypervisors.ErrInvalid)
			})
			mk := observed.Marker{Installation: inst, MachineID: "m", Cluster: "c-1"}
			steps := chain(step(planner.ActionWaitAgent, tg, planner.Params{}), step(planner.ActionBind, tg, planner.Params{Marker: &mk}),
				step(planner.ActionExecBootstrap, tg, planner.Params{Exec: []string{libvirt.HookPath, "c-1"}, BlobPath: libvirt.BlobPath}))
			_, err := newExec(hv, []byte("secret")).Run(context.Background(), planner.Change{Machine: "m", Steps: steps}, "op-1")
			if fail != (err != nil) || fail && !errors.Is(err, hypervisors.ErrPermission) {
				t.Fatalf("err = %v", err)
			}
			if n := len(hv.Bootstraps(tg)); n != map[bool]int{false: 1, true: 0}[fail] {
				t.Errorf("%d bootstraps", n)
			}
			g, _ := hv.Guest(tg)
			for p := range g.Files {
				if p != guest.WrapperPath { // the wrapper may stay
					t.Errorf("%s left in the guest", p)
				}
			}
		})
	}
}
