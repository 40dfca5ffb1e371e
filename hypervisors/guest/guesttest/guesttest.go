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
	// Late: the call is held (the caller sees it lost) and reaches the
	// agent only when Env.Replay is called.
	Late
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
	// Argv is the command of an exec.
	Argv []string
}

func (c Call) String() string {
	switch {
	case c.Wrapper():
		return c.Name + " wrapper"
	case c.Kind == "exec" && len(c.Argv) > 2 && c.Argv[1] == "-c":
		return c.Name + " helper"
	case c.Kind == "exec" && len(c.Argv) > 0:
		return c.Name + " " + c.Argv[0]
	}
	return c.Name
}

// Wrapper reports whether the call starts the guest-op wrapper.
func (c Call) Wrapper() bool {
	return c.Kind == "exec" && len(c.Argv) > 1 && c.Argv[1] == guest.WrapperPath
}

// Env is one transport on one simulated guest.
type Env struct {
	// Agent runs the protocol over the transport under test (with a fast
	// poll).
	Agent *guest.Agent
	// Seen returns the wire calls made so far, in order.
	Seen func() []Call
	// Replay delivers the calls a Late fault held, now.
	Replay func()
}

// Transport is an adapter's transport as the suite drives it.
type Transport struct {
	// Faults are the wire's own faults; the suite also uses a Late fault
	// (Fault{Name: "late", Class: Late}), which every transport supports.
	Faults []Fault
	// New returns an Env on g whose n-th wire call (from 0) suffers f; n
	// < 0 injects nothing. onFault, if set, is called when the fault is
	// injected (before the call fails or is answered).
	New func(t *testing.T, g *guestsim.Guest, n int, f Fault, onFault func()) Env
}

// LateFault is the Late fault every transport implements.
var LateFault = Fault{Name: "late", Class: Late}

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

// RunStep runs one guest step through the executor on env, as the
// replica that accepted the operation (it holds the blob), and returns
// how often ExecStarting was called.
func RunStep(t *testing.T, env Env, s planner.Step, deadline time.Duration) (starting int, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	return runStep(ctx, env, s, func() bool { return true })
}

// runStep runs s through a fresh executor (a leader): with the blob in
// memory (the replica that accepted the Configure) or without (a leader
// that took over, until a retry of the Configure brings it back): have
// says, each time the executor asks, whether it has it.
func runStep(ctx context.Context, env Env, s planner.Step, have func() bool) (int, error) {
	var calls atomic.Int32
	ex := executor.New(executor.Options{Hypervisor: agentHV{a: env.Agent}, Installation: "inst",
		MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond, BlobGrace: 200 * time.Millisecond,
		Blob:         func(string, string) ([]byte, bool) { return []byte(Blob), have() },
		ExecStarting: func(context.Context, string, string, string) error { calls.Add(1); return nil }})
	_, err := ex.Run(ctx, planner.Change{Machine: "m", Steps: []planner.Step{s}}, "op-1")
	return int(calls.Load()), err
}

// sequence runs step cleanly on a fresh guest and returns the wire calls
// it made.
func sequence(t *testing.T, tr Transport, step planner.Step) []Call {
	t.Helper()
	g := NewGuest()
	env := tr.New(t, g, -1, Fault{}, nil)
	if _, err := RunStep(t, env, step, 20*time.Second); err != nil {
		t.Fatalf("%s: clean run: %v", step.Action, err)
	}
	if n := Starts(g, step); n != 1 {
		t.Fatalf("%s: clean run: %d starts", step.Action, n)
	}
	return env.Seen()
}

// clean checks the guest after a step that succeeded: one start (and one
// join, for the bootstrap), and no blob left.
func clean(t *testing.T, g *guestsim.Guest, step planner.Step) {
	t.Helper()
	if n := Starts(g, step); n != 1 || step.Action == planner.ActionExecBootstrap && Joins(g) != 1 {
		t.Errorf("%d starts, %d joins; want 1 start (and one join)", n, Joins(g))
	}
	noBlob(t, g)
}

func noBlob(t *testing.T, g *guestsim.Guest) {
	t.Helper()
	for _, p := range g.Files() {
		if strings.HasPrefix(p, BlobPath) || strings.HasPrefix(p, guest.StageDir+"/") {
			t.Errorf("%s stayed in the guest", p)
		}
	}
}

// TestAtMostOnceAtEveryCall injects every fault at every wire call of
// each guest step (for the bootstrap: the wrapper's delivery and the
// blob's staging with their helper execs and polls, the wrapper's exec
// and each of its polls, the blob's removal; for the drain: the wrapper's
// delivery, its exec and polls): the command starts exactly once and the
// step succeeds, whatever the fault, because what the agent forgot or an
// answer lost is read back from the guest's record of the command; the
// blob never stays.
func TestAtMostOnceAtEveryCall(t *testing.T, tr Transport) {
	for _, step := range Steps {
		seq := sequence(t, tr, step)
		for n, call := range seq {
			for _, f := range tr.Faults {
				if f.Slow && !call.Wrapper() {
					continue
				}
				t.Run(fmt.Sprintf("%s/%02d-%s/%s", step.Action, n, call, f.Name), func(t *testing.T) {
					t.Parallel()
					g := NewGuest()
					starting, err := RunStep(t, tr.New(t, g, n, f, nil), step, 30*time.Second)
					if n := Starts(g, step); n > 1 {
						t.Fatalf("the command started %d times", n)
					}
					if err != nil {
						t.Fatalf("err = %v, want success (the fault is retried or recovered from the record)", err)
					}
					if starting != 1 {
						t.Errorf("ExecStarting called %d times, want 1", starting)
					}
					clean(t, g, step)
				})
			}
		}
	}
}

// TestLeaderKilledAtEveryCall stops the leader running a guest step at
// every wire call of the step (kill -9: the call is dropped before the
// agent, applied with its answer lost, or, for the wrapper's start
// request, held and delivered late, after the next leader ran), then lets
// a new leader (a fresh executor without the blob, which lives only in the
// first leader's memory) run the step again. The command runs exactly
// once in all; the new leader completes the step with its outcome; the
// only failure allowed is a Configure whose blob never reached the guest,
// which must say so and run nothing. When a retry of the Configure brings
// the blob back to the new leader while it waits, even that succeeds.
func TestLeaderKilledAtEveryCall(t *testing.T, tr Transport) {
	faults := []Fault{{Name: "lost-before", Class: LostBefore}, {Name: "lost-after", Class: LostAfter}, LateFault}
	for _, step := range Steps {
		seq := sequence(t, tr, step)
		for n, call := range seq {
			for _, f := range faults {
				if f.Class == Late && !call.Wrapper() {
					// The wrapper's start request arriving after the next
					// leader ran the step is what the claim in the guest
					// is for; a helper arriving late only leaves an empty
					// part file behind.
					continue
				}
				for _, retried := range []bool{false, true} {
					name := fmt.Sprintf("%s/%02d-%s/%s", step.Action, n, call, f.Name)
					if retried {
						if step.Action != planner.ActionExecBootstrap {
							continue
						}
						name += "/retry-brings-blob"
					}
					t.Run(name, func(t *testing.T) {
						t.Parallel()
						g := NewGuest()
						ctx1, kill := context.WithCancel(context.Background())
						defer kill()
						env := tr.New(t, g, n, f, kill)
						// The first leader dies at call n.
						_, _ = runStep(ctx1, env, step, func() bool { return true })
						// The next one, without the blob (a retry of the
						// Configure may bring it after a while).
						var asked atomic.Int32
						have := func() bool { return retried && asked.Add(1) > 2 }
						ctx2, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						defer cancel()
						_, err := runStep(ctx2, env, step, have)
						// A request the dead leader had in flight arrives now.
						env.Replay()
						if n := Starts(g, step); n > 1 {
							t.Fatalf("the command started %d times", n)
						}
						if errors.Is(err, hypervisors.ErrOutcomeUnknown) {
							t.Fatalf("err = %v: nothing here makes the outcome unknowable", err)
						}
						if err != nil && strings.Contains(err.Error(), executor.BlobNeverDelivered) && !retried {
							t.Logf("the blob never reached the guest: %v", err)
							if Starts(g, step) != 0 {
								t.Errorf("the blob never reached the guest, yet the hook started")
							}
							noBlob(t, g)
							return
						}
						if err != nil {
							t.Fatalf("err = %v, want success", err)
						}
						clean(t, g, step)
					})
				}
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
	_, err := RunStep(t, tr.New(t, g, -1, Fault{}, nil), Steps[0], 300*time.Millisecond)
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
			env := tr.New(t, g, -1, Fault{}, nil)
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
