package guesttest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/executor"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/guest"
	"github.com/bigfleet-vm/provider/hypervisors/guest/guestsim"
	"github.com/bigfleet-vm/provider/planner"
)

// Class is what a fault does to one wire call.
type Class int

const (
	// Refused: the hypervisor refuses the call before asking the agent
	// (no agent connected): nothing happened, and the caller can tell.
	Refused Class = iota
	// LostBefore: the call is lost before the agent got it; the caller
	// cannot tell whether it was.
	LostBefore
	// LostAfter: the agent did it; its answer is lost.
	LostAfter
	// RestartAgent: the agent restarts just before the call (it forgets
	// every pid and handle; processes run on).
	RestartAgent
)

// Fault is one way a transport's wire can fail a call.
type Fault struct {
	Name  string
	Class Class
	// Slow faults cost a transport timeout; the suite injects them only
	// at the calls that matter most.
	Slow bool
}

// Call is one wire call as the suite sees it.
type Call struct {
	// Kind is "exec", "status", "write" or "other".
	Kind string
	// Name is the wire's name of the request (e.g. "guest-file-open").
	Name string
	// Argv0 names the program of an exec.
	Argv0 string
}

func (c Call) String() string {
	if c.Kind == "exec" {
		return c.Name + " " + c.Argv0
	}
	return c.Name
}

// Env is one transport on one simulated guest.
type Env struct {
	// Agent runs the protocol over the transport under test (with a fast
	// poll).
	Agent *guest.Agent
	// Seen returns the wire calls made so far, in order.
	Seen func() []Call
}

// Transport is an adapter's transport as the suite drives it.
type Transport struct {
	Faults []Fault
	// New returns an Env on g whose n-th wire call (from 0) suffers f; n
	// < 0 injects nothing.
	New func(t *testing.T, g *guestsim.Guest, n int, f Fault) Env
}

// The guest's programs.
const (
	Hook     = "/opt/bigfleet/bootstrap"
	BlobPath = "/opt/bigfleet/bootstrap.blob"
	Blob     = "kubeadm join 10.0.0.1:6443 --token abcdef.0123456789abcdef"
	joined   = "/var/lib/bigfleet/joined"
	// Hang makes the hook run until the guest reboots while it exists.
	Hang = "/etc/bigfleet/hang"
)

// NewGuest returns a guest whose processes each report "running" once,
// with the bootstrap hook (Hook <cluster>: it needs the blob at BlobPath
// and appends the cluster to a file; it runs for three polls) and a drain
// (planner.DrainArgv; two polls).
func NewGuest() *guestsim.Guest {
	g := guestsim.New(func(argv []string) (guestsim.Program, bool) {
		switch {
		case argv[0] == Hook:
			return func(p *guestsim.Proc) guestsim.Run {
				if _, ok := p.File(BlobPath); !ok || len(argv) != 2 {
					return guestsim.Run{ExitCode: 1, Stderr: BlobPath + ": No such file or directory\n"}
				}
				if _, hang := p.File(Hang); hang {
					return guestsim.Run{Forever: true}
				}
				prev, _ := p.File(joined)
				p.SetFile(joined, append(prev, argv[1]+"\n"...), 0o644)
				return guestsim.Run{Stdout: "joined " + argv[1] + "\n", Polls: 2}
			}, true
		case isDrain(argv):
			return func(*guestsim.Proc) guestsim.Run { return guestsim.Run{Stdout: "node drained\n", Polls: 1} }, true
		}
		return nil, false
	}, nil)
	g.SetPolls(1)
	return g
}

func isDrain(argv []string) bool {
	return len(argv) == 3 && argv[0] == "/bin/sh" && strings.Contains(argv[2], "kubectl drain")
}

// Starts counts the starts of a step's command in g.
func Starts(g *guestsim.Guest, s planner.Step) int {
	if s.Action == planner.ActionExecDrain {
		return g.Count(isDrain)
	}
	return g.Count(func(argv []string) bool { return argv[0] == Hook })
}

// Joins counts the hook's successful joins.
func Joins(g *guestsim.Guest) int {
	f, _ := g.File(joined)
	return strings.Count(string(f.Data), "\n")
}

var target = hypervisors.Target{Zone: "z", Name: "vm"}

// Steps are the guest steps the suite runs.
var Steps = []planner.Step{
	{ID: "z/vm/exec-bootstrap", Action: planner.ActionExecBootstrap, Target: target,
		Params: planner.Params{Exec: []string{Hook, "c-1"}, BlobPath: BlobPath}},
	{ID: "z/vm/exec-drain", Action: planner.ActionExecDrain, Target: target,
		Params: planner.Params{Exec: planner.DrainArgv(30)}},
}

// agentHV is a Hypervisor whose agent methods are an Agent's: the
// executor calls nothing else for a guest step.
type agentHV struct {
	hypervisors.Hypervisor
	a *guest.Agent
}

func (h agentHV) AgentPing(ctx context.Context, _ hypervisors.Target) error { return h.a.Ping(ctx) }

func (h agentHV) AgentExec(ctx context.Context, _ hypervisors.Target, argv []string) (hypervisors.ExecResult, error) {
	return h.a.Exec(ctx, argv)
}

func (h agentHV) AgentWriteFile(ctx context.Context, _ hypervisors.Target, p string, data []byte, mode os.FileMode) error {
	return h.a.WriteFile(ctx, p, data, mode)
}

func (h agentHV) AgentRemoveFile(ctx context.Context, _ hypervisors.Target, p string) error {
	return h.a.RemoveFile(ctx, p)
}

// RunStep runs one guest step through the executor on env and returns
// how often ExecStarting was called.
func RunStep(t *testing.T, env Env, s planner.Step, deadline time.Duration) (starting int, err error) {
	t.Helper()
	var calls atomic.Int32
	ex := executor.New(executor.Options{Hypervisor: agentHV{a: env.Agent}, Installation: "inst",
		MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond,
		Blob:         func(string, string) ([]byte, bool) { return []byte(Blob), true },
		ExecStarting: func(context.Context, string, string, string) error { calls.Add(1); return nil }})
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	_, err = ex.Run(ctx, planner.Change{Machine: "m", Steps: []planner.Step{s}}, "op-1")
	return int(calls.Load()), err
}

// TestAtMostOnceAtEveryCall injects every fault at every wire call of
// each guest step (for the bootstrap: the blob's write with its helper
// execs and their polls, the hook's exec and each of its polls, the
// blob's removal; for the drain: its exec and polls): the command starts
// at most once; only faults that make its start or end unknowable fail
// the step, with ErrOutcomeUnknown naming the pid; the blob never stays.
func TestAtMostOnceAtEveryCall(t *testing.T, tr Transport) {
	for _, step := range Steps {
		g := NewGuest()
		env := tr.New(t, g, -1, Fault{})
		if _, err := RunStep(t, env, step, 10*time.Second); err != nil {
			t.Fatalf("%s: clean run: %v", step.Action, err)
		}
		sequence := env.Seen()
		if n := Starts(g, step); n != 1 {
			t.Fatalf("%s: clean run: %d starts", step.Action, n)
		}
		cmdExec := -1
		for i, c := range sequence {
			if c.Kind == "exec" && c.Argv0 == step.Params.Exec[0] {
				cmdExec = i
			}
		}
		var polls []int
		for i := cmdExec + 1; cmdExec >= 0 && i < len(sequence) && sequence[i].Kind == "status"; i++ {
			polls = append(polls, i)
		}
		if cmdExec < 0 || len(polls) < 2 {
			t.Fatalf("%s: want the command run and polled at least twice, sequence %v", step.Action, sequence)
		}
		final := polls[len(polls)-1]
		// unknown says which faults make the command's outcome
		// unknowable: its start request unanswered (it may or may not
		// run), the answer that reported its exit lost (the agent forgets
		// a pid once it reported it), or the agent restarted while it ran.
		unknown := func(n int, c Class) bool {
			switch {
			case n == cmdExec:
				return c == LostBefore || c == LostAfter
			case n == final && c == LostAfter:
				return true
			}
			return c == RestartAgent && contains(polls, n)
		}
		for n, call := range sequence {
			for _, f := range tr.Faults {
				if f.Slow && n != cmdExec && n != polls[0] && n != final && n != 0 {
					continue
				}
				t.Run(fmt.Sprintf("%s/%02d-%s/%s", step.Action, n, call, f.Name), func(t *testing.T) {
					t.Parallel()
					g := NewGuest()
					starting, err := RunStep(t, tr.New(t, g, n, f), step, 30*time.Second)
					started := Starts(g, step)
					if started > 1 {
						t.Fatalf("the command started %d times", started)
					}
					for _, p := range g.Files() {
						if strings.HasPrefix(p, BlobPath) {
							t.Errorf("%s stayed in the guest", p)
						}
					}
					if starting != 1 {
						t.Errorf("ExecStarting called %d times, want 1", starting)
					}
					if !unknown(n, f.Class) {
						if err != nil {
							t.Fatalf("err = %v, want success (the fault is retried)", err)
						}
						if started != 1 || step.Action == planner.ActionExecBootstrap && Joins(g) != 1 {
							t.Errorf("%d starts, %d joins; want 1 start (and one join)", started, Joins(g))
						}
						return
					}
					var u *hypervisors.UnknownOutcomeError
					if !errors.As(err, &u) || hypervisors.Retryable(err) {
						t.Fatalf("err = %v, want ErrOutcomeUnknown", err)
					}
					if n != cmdExec && (u.PID == 0 || !strings.Contains(err.Error(), "started as pid")) {
						t.Errorf("err %q does not name the pid", err)
					}
					if strings.Contains(err.Error(), Blob) {
						t.Error("the error holds the blob")
					}
				})
			}
		}
	}
}

// TestDeadline: a hook still running at the deadline is an unknown
// outcome that names its pid and the deadline; it is not sent again.
func TestDeadline(t *testing.T, tr Transport) {
	g := NewGuest()
	if err := g.Write(Hang, nil); err != nil {
		t.Fatal(err)
	}
	_, err := RunStep(t, tr.New(t, g, -1, Fault{}), Steps[0], 300*time.Millisecond)
	var u *hypervisors.UnknownOutcomeError
	if !errors.As(err, &u) || u.PID == 0 || !strings.Contains(err.Error(), "deadline passed") {
		t.Fatalf("err = %v, want an unknown outcome naming the pid and the deadline", err)
	}
	if n := Starts(g, Steps[0]); n != 1 {
		t.Errorf("hook starts = %d, want 1", n)
	}
}

// TestWriteFile: a file of any size reaches the guest whole, with its
// mode, through private parts that do not stay behind.
func TestWriteFile(t *testing.T, tr Transport) {
	for _, size := range []int{0, 1, 100 << 10, 300<<10 + 7} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			g := NewGuest()
			env := tr.New(t, g, -1, Fault{})
			data := make([]byte, size)
			for i := range data {
				data[i] = byte(i*7 + i/251)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := env.Agent.WriteFile(ctx, "/etc/bigfleet/f", data, 0o640); err != nil {
				t.Fatal(err)
			}
			f, ok := g.File("/etc/bigfleet/f")
			if !ok || string(f.Data) != string(data) || f.Mode != 0o640 {
				t.Fatalf("file: present %v, %d bytes (want %d), mode %o", ok, len(f.Data), size, f.Mode)
			}
			if files := g.Files(); len(files) != 1 {
				t.Errorf("guest files %v, want only the target", files)
			}
			if err := env.Agent.RemoveFile(ctx, "/etc/bigfleet/f"); err != nil {
				t.Fatal(err)
			}
			if files := g.Files(); len(files) != 0 {
				t.Errorf("guest files after removal: %v", files)
			}
		})
	}
}

func contains(s []int, n int) bool {
	for _, v := range s {
		if v == n {
			return true
		}
	}
	return false
}
