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
	"github.com/bigfleet-vm/provider/hypervisors/fake"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/planner"
)

// failNth fails the n-th hook call (counting every op, from 0) with err
// and returns the calls seen so far.
func failNth(n int, err error) (fake.Hook, func() []fake.Call) {
	var mu sync.Mutex
	var seen []fake.Call
	return func(_ context.Context, c fake.Call) error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, c)
			if len(seen)-1 == n {
				return err
			}
			return nil
		}, func() []fake.Call {
			mu.Lock()
			defer mu.Unlock()
			return append([]fake.Call(nil), seen...)
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
	setHook   func(fake.Hook)
	guest     func() fake.GuestState
	bootstrap planner.Step
	drain     planner.Step
	ready     planner.Step
}

func newGuestVM(t *testing.T, shape hypervisors.Shape, opts fake.Options) guestVM {
	t.Helper()
	ctx := context.Background()
	opts.Zones = []string{"z"}
	mk := observed.Marker{Installation: inst, MachineID: "m", Cluster: "c-1"}
	var g guestVM
	var tg hypervisors.Target
	switch shape {
	case hypervisors.ShapeLibvirt:
		hv := fake.NewLibvirt(opts)
		if err := hv.AddOwnedVM("z", "vm", mk, observed.PowerRunning); err != nil {
			t.Fatal(err)
		}
		tg = hypervisors.Target{Zone: "z", Name: "vm"}
		g = guestVM{hv: hv, setHook: hv.SetHook, guest: func() fake.GuestState { s, _ := hv.Guest(tg); return s }}
		g.bootstrap = step(planner.ActionExecBootstrap, tg, planner.Params{Exec: []string{planner.LibvirtHook, "c-1"}, BlobPath: planner.LibvirtBlobPath})
	case hypervisors.ShapeProxmox:
		hv := fake.NewProxmox(opts)
		id, err := hv.CloneVM(ctx, "z", hypervisors.CloneSpec{Name: "vm", TemplateVMID: fake.DefaultTemplateVMID, Marker: mk})
		if err != nil {
			t.Fatal(err)
		}
		tg = hypervisors.Target{Zone: "z", Name: "vm", VMID: id}
		if err := hv.Start(ctx, tg); err != nil {
			t.Fatal(err)
		}
		g = guestVM{hv: hv, setHook: hv.SetHook, guest: func() fake.GuestState { s, _ := hv.Guest(tg); return s }}
		g.bootstrap = step(planner.ActionExecBootstrap, tg, planner.Params{Exec: []string{"/bin/sh", fake.DefaultBootstrapPath}, BlobPath: fake.DefaultBootstrapPath})
	}
	g.drain = step(planner.ActionExecDrain, tg, planner.Params{Exec: planner.DrainArgv(30)})
	g.ready = step(planner.ActionExecReady, tg, planner.Params{Exec: []string{fake.DefaultReadyCommand}})
	t.Cleanup(func() { g.hv.Close() })
	return g
}

var shapes = []hypervisors.Shape{hypervisors.ShapeLibvirt, hypervisors.ShapeProxmox}

// A fault at every call of the bootstrap sequence, the simulated agent's
// wire included (write the blob, run the hook and poll it, its answer,
// remove the blob): the hook starts at most once; only a fault after it
// started (its answer lost, its status unreadable) fails the step, with
// ErrOutcomeUnknown and a last_error that says so; the blob never stays.
func TestBootstrapRunsAtMostOnceUnderFaults(t *testing.T) {
	blob := []byte("kubeadm join --token abcdef.0123456789abcdef")
	for _, shape := range shapes {
		clean := newGuestVM(t, shape, fake.Options{})
		hook, seenClean := failNth(-1, nil)
		clean.setHook(hook)
		if _, err := newExec(clean.hv, blob).Run(context.Background(), planner.Change{Machine: "m", Steps: []planner.Step{clean.bootstrap}}, "op"); err != nil {
			t.Fatalf("%s: clean run: %v", shape, err)
		}
		sequence := seenClean()
		// phase says where each call is: writing the blob, running the
		// hook (from its AgentExec on), or removing the blob.
		phase := make([]string, len(sequence))
		cur := "write"
		for i, c := range sequence {
			switch c.Op {
			case "AgentExec":
				cur = "hook"
			case "AgentRemoveFile":
				cur = "remove"
			}
			phase[i] = cur
		}
		for n, c := range sequence {
			for _, fault := range []error{hypervisors.ErrTransient, hypervisors.ErrAgentNotReady, errors.New("connection reset by peer")} {
				t.Run(fmt.Sprintf("%s/%02d-%s-%s/%v", shape, n, phase[n], c.Op, fault), func(t *testing.T) {
					g := newGuestVM(t, shape, fake.Options{})
					hook, _ := failNth(n, fault)
					g.setHook(hook)
					starts := &execStarts{}
					ex := newExec(g.hv, blob)
					ex.o.ExecStarting = starts.hook
					_, err := ex.Run(context.Background(), planner.Change{Machine: "m", Steps: []planner.Step{g.bootstrap}}, "op")
					st := g.guest()
					retryable := hypervisors.Retryable(fault)
					if st.Starts.Bootstrap > 1 {
						t.Fatalf("the hook started %d times", st.Starts.Bootstrap)
					}
					if _, ok := st.Files[g.bootstrap.Params.BlobPath]; ok {
						t.Error("the blob stayed in the guest")
					}
					// A helper of the write whose outcome is lost is
					// repeated with the whole (idempotent) write.
					helperLost := c.Op == fake.AgentStatusOp || c.Op == fake.ExecAnswerOp
					writeFails := phase[n] == "write" && !retryable && !helperLost
					wantStarting := 1
					if writeFails {
						wantStarting = 0
					}
					if got := starts.count(); got != wantStarting {
						t.Errorf("ExecStarting called %d times, want %d", got, wantStarting)
					}
					switch {
					case phase[n] == "hook" && (c.Op == fake.ExecAnswerOp || c.Op == fake.AgentStatusOp && !retryable):
						// The hook ran; its answer was lost, or its status
						// could not be read.
						if !errors.Is(err, hypervisors.ErrOutcomeUnknown) || hypervisors.Retryable(err) {
							t.Fatalf("err = %v, want ErrOutcomeUnknown", err)
						}
						for _, want := range []string{"bootstrap hook", "started as pid", "outcome is unknown"} {
							if !strings.Contains(err.Error(), want) {
								t.Errorf("last_error %q does not say %q", err, want)
							}
						}
						if strings.Contains(err.Error(), string(blob)) {
							t.Error("last_error holds the blob")
						}
						if st.Starts.Bootstrap != 1 {
							t.Errorf("hook starts = %d, want 1", st.Starts.Bootstrap)
						}
					case writeFails || phase[n] == "hook" && !retryable:
						// A terminal error before the hook started: it never
						// runs.
						if err == nil || st.Starts.Bootstrap != 0 {
							t.Errorf("err = %v with %d starts; want the terminal error and no start", err, st.Starts.Bootstrap)
						}
					default:
						// Retried: before the hook started, while polling
						// it, or removing the blob after it.
						if err != nil {
							t.Fatalf("a %v at %s should be retried: %v", fault, c.Op, err)
						}
						if st.Starts.Bootstrap != 1 || len(st.Bootstraps) != 1 {
							t.Errorf("hook starts = %d, bootstraps = %d; want 1 and 1", st.Starts.Bootstrap, len(st.Bootstraps))
						}
					}
				})
			}
		}
	}
}

// The drain runs at most once: a lost answer fails it (unknown outcome),
// a refusal before the start is retried.
func TestDrainRunsAtMostOnce(t *testing.T) {
	tests := []struct {
		name       string
		hook       func() fake.Hook
		wantErr    error
		wantDrains int
	}{
		{name: "clean", wantDrains: 1},
		{name: "agent not ready twice", hook: func() fake.Hook { return fake.FailN("AgentExec", 2, hypervisors.ErrAgentNotReady) }, wantDrains: 1},
		{name: "answer lost", hook: func() fake.Hook { return fake.FailN(fake.ExecAnswerOp, 1, hypervisors.ErrTransient) },
			wantErr: hypervisors.ErrOutcomeUnknown, wantDrains: 1},
		{name: "permission", hook: func() fake.Hook { return fake.FailN("AgentExec", 1, hypervisors.ErrPermission) },
			wantErr: hypervisors.ErrPermission},
	}
	for _, shape := range shapes {
		for _, tc := range tests {
			t.Run(string(shape)+"/"+tc.name, func(t *testing.T) {
				g := newGuestVM(t, shape, fake.Options{})
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

// ExecStarting refusing (e.g. an earlier run may have started the hook)
// sends nothing and fails the step with its error; the blob is removed.
func TestExecStartingRefusalSendsNothing(t *testing.T) {
	for _, shape := range shapes {
		t.Run(string(shape), func(t *testing.T) {
			g := newGuestVM(t, shape, fake.Options{})
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
			if _, ok := st.Files[g.bootstrap.Params.BlobPath]; ok {
				t.Error("the blob stayed in the guest")
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
			g := newGuestVM(t, shape, fake.Options{Faults: true})
			if err := g.hv.SetMarker(context.Background(), g.bootstrap.Target, observed.Marker{Installation: inst, MachineID: "m", Cluster: fake.FaultTimeout}); err != nil {
				t.Fatal(err)
			}
			if shape == hypervisors.ShapeLibvirt {
				g.bootstrap.Params.Exec[1] = fake.FaultTimeout
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

// A readiness probe whose answer is lost ends the gate: the probe may
// still be running, so it is not re-sent blindly.
func TestReadinessProbeUnknownOutcomeEndsGate(t *testing.T) {
	for _, shape := range shapes {
		t.Run(string(shape), func(t *testing.T) {
			g := newGuestVM(t, shape, fake.Options{})
			g.setHook(fake.FailN(fake.ExecAnswerOp, 1, hypervisors.ErrTransient))
			_, err := newExec(g.hv, nil).Run(context.Background(), planner.Change{Machine: "m", Steps: []planner.Step{g.ready}}, "op")
			if !errors.Is(err, hypervisors.ErrOutcomeUnknown) {
				t.Fatalf("err = %v, want ErrOutcomeUnknown", err)
			}
			if st := g.guest(); st.Starts.Ready != 1 {
				t.Errorf("probe started %d times, want 1", st.Starts.Ready)
			}
		})
	}
}
