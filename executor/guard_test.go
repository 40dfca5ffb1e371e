package executor

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/libvirtsim"
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/planner"
)

var errDeposed = errors.New("leadership lost")

// TestGuardBeforeEveryAttempt: the term ends during a step's first
// attempt (which fails retryably); the step makes no second attempt,
// whatever it touches: a hypervisor call, the guest agent, a guest
// command, the blob in the guest.
func TestGuardBeforeEveryAttempt(t *testing.T) {
	blob := []byte("kubeadm join --token abcdef.0123456789abcdef")
	tests := []struct {
		name string
		op   string // the hook op whose first call fails retryably and ends the term
		step func(g guestVM, stopped hypervisors.Target) planner.Step
	}{
		{"start", "Start", func(_ guestVM, tg hypervisors.Target) planner.Step {
			return step(planner.ActionStart, tg, planner.Params{})
		}},
		{"wait-agent", "AgentPing", func(g guestVM, _ hypervisors.Target) planner.Step {
			return step(planner.ActionWaitAgent, g.drain.Target, planner.Params{})
		}},
		{"exec-drain", "AgentExec", func(g guestVM, _ hypervisors.Target) planner.Step { return g.drain }},
		{"exec-ready", "AgentExec", func(g guestVM, _ hypervisors.Target) planner.Step { return g.ready }},
		{"exec-bootstrap write", "AgentWriteFile", func(g guestVM, _ hypervisors.Target) planner.Step { return g.bootstrap }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuestVM(t, "libvirt", simcore.Options{})
			lv := g.hv.(*libvirtsim.Libvirt)
			if err := lv.AddOwnedVM("z", "stopped", observed.Marker{Installation: inst, MachineID: "m"}, observed.PowerStopped); err != nil {
				t.Fatal(err)
			}
			var deposed atomic.Bool
			var mu sync.Mutex
			calls := map[string]int{}
			g.setHook(func(_ context.Context, c simcore.Call) error {
				mu.Lock()
				defer mu.Unlock()
				calls[c.Op]++
				if c.Op == tc.op && calls[c.Op] == 1 {
					deposed.Store(true) // the lease runs out while this attempt fails
					return hypervisors.ErrTransient
				}
				return nil
			})
			var asked atomic.Int64 // Guard is called concurrently (the blob's early staging)
			ex := New(Options{Hypervisor: g.hv, Installation: inst, MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond,
				Blob: func(string, string) ([]byte, bool) { return blob, true },
				Guard: func() error {
					asked.Add(1)
					if deposed.Load() {
						return errDeposed
					}
					return nil
				}})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			s := tc.step(g, hypervisors.Target{Zone: "z", Name: "stopped"})
			_, err := ex.Run(ctx, planner.Change{Machine: "m", Steps: []planner.Step{s}}, "op")
			if !errors.Is(err, errDeposed) {
				t.Fatalf("err = %v, want the guard's error", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if diff := cmp.Diff(1, calls[tc.op]); diff != "" {
				t.Errorf("attempts of %s after the term ended (-want +got):\n%s\n(all calls %v)", tc.op, diff, calls)
			}
			if n := asked.Load(); n < 2 {
				t.Errorf("the guard was asked %d times, want once before the step and once per attempt", n)
			}
		})
	}
}

// TestRepairAttemptsBudget: a step of a change without an operation
// stops after RepairAttempts attempts of a retryable failure; the same
// step of an operation keeps trying until its deadline.
func TestRepairAttemptsBudget(t *testing.T) {
	for _, tc := range []struct {
		name, opID string
		wantErr    error
		want       func(n int) bool
	}{
		{"repair", "", hypervisors.ErrTransient, func(n int) bool { return n == 3 }},
		{"operation", "op-1", context.DeadlineExceeded, func(n int) bool { return n > 3 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hv := libvirtsim.NewLibvirt(libvirtsim.Options{Options: simcore.Options{Zones: []string{"z"}}})
			if err := hv.AddOwnedVM("z", "vm", observed.Marker{Installation: inst, MachineID: "m"}, observed.PowerStopped); err != nil {
				t.Fatal(err)
			}
			hv.SetHook(simcore.FailN("Start", 1<<30, hypervisors.ErrTransient))
			ex := New(Options{Hypervisor: hv, Installation: inst, MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond, RepairAttempts: 3})
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			_, err := ex.Run(ctx, planner.Change{Machine: "m", Steps: []planner.Step{
				step(planner.ActionStart, hypervisors.Target{Zone: "z", Name: "vm"}, planner.Params{})}}, tc.opID)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if n := hv.Calls()["Start"]; !tc.want(n) {
				t.Errorf("%d Start attempts", n)
			}
		})
	}
}
