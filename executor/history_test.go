package executor

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
	"github.com/bigfleet-vm/provider/planner"
)

type recorded struct {
	mu  sync.Mutex
	evs []desired.Event
}

func (r *recorded) record(machine string, ev desired.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if machine != "m" {
		panic("recorded for " + machine)
	}
	r.evs = append(r.evs, ev)
}

// Every step applied goes to the machine's history with its action,
// reason, outcome and error class, and every guest command with its exit
// status.
func TestRunRecordsStepsAndGuestCommands(t *testing.T) {
	for _, shape := range shapes {
		t.Run(string(shape), func(t *testing.T) {
			g := newGuestVM(t, shape, simcore.Options{})
			rec := &recorded{}
			ex := newExec(g.hv, nil)
			ex.o.Record = rec.record
			if _, err := ex.Run(context.Background(), planner.Change{Machine: "m", Steps: []planner.Step{g.drain}}, "op"); err != nil {
				t.Fatal(err)
			}
			// A step that fails terminally records its class and error.
			g.setHook(simcore.FailN("AgentExec", 1, hypervisors.ErrPermission))
			_, err := ex.Run(context.Background(), planner.Change{Machine: "m", Steps: []planner.Step{g.drain}}, "op2")
			if !errors.Is(err, hypervisors.ErrPermission) {
				t.Fatalf("err = %v", err)
			}
			type brief struct{ Kind, Op, Action, Outcome, Class string }
			var got []brief
			exits := 0
			for _, e := range rec.evs {
				got = append(got, brief{e.Kind, e.OpID, e.Action, e.Outcome, e.Class})
				if e.Exit != nil && *e.Exit == 0 {
					exits++
				}
				if e.Outcome == "error" && e.Error == "" {
					t.Errorf("an error event without its error: %+v", e)
				}
			}
			want := []brief{
				{"guest", "op", "exec-drain", "ok", ""},
				{"step", "op", "exec-drain", "ok", ""},
				{"guest", "op2", "exec-drain", "error", "permission"},
				{"step", "op2", "exec-drain", "error", "permission"},
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("history (-want +got):\n%s", diff)
			}
			if exits != 1 {
				t.Errorf("%d exit statuses 0 recorded, want 1", exits)
			}
		})
	}
}

func TestErrorClass(t *testing.T) {
	for err, want := range map[error]string{
		nil: "", hypervisors.ErrLocked: "locked", context.DeadlineExceeded: "deadline",
		&hypervisors.UnknownOutcomeError{Command: "x", Why: "y"}: "outcome-unknown",
		errors.New("plain"): "other",
	} {
		if got := ErrorClass(err); got != want {
			t.Errorf("ErrorClass(%v) = %q, want %q", err, got, want)
		}
	}
}
