package libvirt

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/bigfleet-vm/provider/executor"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/planner"
	"github.com/bigfleet-vm/provider/retry"
)

// fault is what the simulated agent does to one command.
type fault int

const (
	faultNone fault = iota
	// faultNotConnected: libvirtd refuses before sending (no agent).
	faultNotConnected
	// faultLostBefore: libvirtd times out; the agent never got it.
	faultLostBefore
	// faultLostAfter: the agent ran it; libvirtd timed out on the reply.
	faultLostAfter
	// faultHangAfter: the agent ran it; the libvirt call never answers.
	faultHangAfter
	// faultReboot: the agent restarted just before this command (it
	// forgets every pid).
	faultReboot
)

func (f fault) String() string {
	return [...]string{"none", "not-connected", "lost-before", "lost-after", "hang-after", "reboot"}[f]
}

type simFile struct {
	data []byte
	mode string
}

type simProc struct {
	status execStatus
	polls  int // "running" answers left
}

// simQGA is qemu-ga behind libvirtd, in memory: files, handles, processes
// and a small command set (the adapter's helper scripts, rm, and the
// bootstrap hook, which needs the blob). It answers through the qgaSend
// seam with the replies and libvirt errors the real stack gives.
type simQGA struct {
	mu         sync.Mutex
	files      map[string]simFile
	handles    map[int]string
	procs      map[int]*simProc
	nextHandle int
	nextPID    int
	polls      int // "running" answers each process gives first
	hookPolls  int // the same for the bootstrap hook

	calls       []string // execute (guest-exec: execute + " " + path)
	hookStarts  int
	drainStarts int
	joined      []string

	faultAt func(n int, call string) fault
	hang    chan struct{}
}

func newSimQGA() *simQGA {
	return &simQGA{files: map[string]simFile{}, handles: map[int]string{}, procs: map[int]*simProc{},
		nextHandle: 1000, nextPID: 4000, polls: 1, hookPolls: 2, hang: make(chan struct{})}
}

func (s *simQGA) reply(v any) (golibvirt.OptString, error) {
	b, err := json.Marshal(map[string]any{"return": v})
	return golibvirt.OptString{string(b)}, err
}

func (s *simQGA) qgaErr(desc string) (golibvirt.OptString, error) {
	b, err := json.Marshal(map[string]any{"error": map[string]string{"class": "GenericError", "desc": desc}})
	return golibvirt.OptString{string(b)}, err
}

var (
	errAgentGone    = golibvirt.Error{Code: uint32(golibvirt.ErrAgentUnresponsive), Message: "Guest agent is not responding: QEMU guest agent is not connected"}
	errAgentTimeout = golibvirt.Error{Code: uint32(golibvirt.ErrAgentCommandTimeout), Message: "Guest agent not available for now"}
)

func (s *simQGA) send(_ *golibvirt.Libvirt, _ golibvirt.Domain, cmd string, _ int32) (golibvirt.OptString, error) {
	var req struct {
		Execute   string          `json:"execute"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal([]byte(cmd), &req); err != nil {
		return nil, err
	}
	s.mu.Lock()
	name := req.Execute
	if name == "guest-exec" {
		var a execArgs
		_ = json.Unmarshal(req.Arguments, &a)
		name += " " + a.Path
	}
	n := len(s.calls)
	s.calls = append(s.calls, name)
	f := faultNone
	if s.faultAt != nil {
		f = s.faultAt(n, name)
	}
	switch f {
	case faultNotConnected:
		s.mu.Unlock()
		return nil, errAgentGone
	case faultLostBefore:
		s.mu.Unlock()
		return nil, errAgentTimeout
	case faultReboot:
		s.procs = map[int]*simProc{}
		s.handles = map[int]string{}
	}
	res, err := s.apply(req.Execute, req.Arguments)
	s.mu.Unlock()
	switch f {
	case faultLostAfter:
		return nil, errAgentTimeout
	case faultHangAfter:
		<-s.hang
		return nil, errors.New("connection closed")
	}
	return res, err
}

// apply runs one command; s.mu is held.
func (s *simQGA) apply(execute string, raw json.RawMessage) (golibvirt.OptString, error) {
	switch execute {
	case "guest-ping":
		return s.reply(map[string]any{})
	case "guest-exec":
		var a execArgs
		if err := json.Unmarshal(raw, &a); err != nil {
			return s.qgaErr("Invalid parameter type")
		}
		s.nextPID++
		polls := s.polls
		if a.Path == planner.LibvirtHook || len(a.Arg) == 2 && strings.Contains(a.Arg[1], "kubectl drain") {
			polls = s.hookPolls
		}
		s.procs[s.nextPID] = &simProc{status: s.run(append([]string{a.Path}, a.Arg...)), polls: polls}
		return s.reply(map[string]int{"pid": s.nextPID})
	case "guest-exec-status":
		var a struct{ PID int }
		_ = json.Unmarshal(raw, &a)
		p, ok := s.procs[a.PID]
		if !ok {
			return s.qgaErr("Invalid parameter 'pid'")
		}
		if p.polls > 0 {
			p.polls--
			return s.reply(map[string]bool{"exited": false})
		}
		delete(s.procs, a.PID) // qemu-ga forgets a reaped process
		return s.reply(p.status)
	case "guest-file-open":
		var a struct{ Path, Mode string }
		_ = json.Unmarshal(raw, &a)
		s.nextHandle++
		s.handles[s.nextHandle] = a.Path
		s.files[a.Path] = simFile{mode: "600"}
		return s.reply(s.nextHandle)
	case "guest-file-write":
		var a struct {
			Handle int
			Buf    string `json:"buf-b64"`
		}
		_ = json.Unmarshal(raw, &a)
		p, ok := s.handles[a.Handle]
		if !ok {
			return s.qgaErr("handle '" + fmt.Sprint(a.Handle) + "' has not been found")
		}
		b, _ := base64.StdEncoding.DecodeString(a.Buf)
		f := s.files[p]
		f.data = append(f.data, b...)
		s.files[p] = f
		return s.reply(map[string]any{"count": len(b), "eof": false})
	case "guest-file-close":
		var a struct{ Handle int }
		_ = json.Unmarshal(raw, &a)
		if _, ok := s.handles[a.Handle]; !ok {
			return s.qgaErr("handle '" + fmt.Sprint(a.Handle) + "' has not been found")
		}
		delete(s.handles, a.Handle)
		return s.reply(map[string]any{})
	}
	return s.qgaErr("The command " + execute + " has not been found")
}

func exitWith(code int, stderr string) execStatus {
	return execStatus{Exited: true, ExitCode: code, ErrData: base64.StdEncoding.EncodeToString([]byte(stderr))}
}

// run executes argv in the simulated guest; s.mu is held.
func (s *simQGA) run(argv []string) execStatus {
	switch {
	case len(argv) == 6 && argv[0] == "/bin/sh" && argv[2] == prepareScript:
		s.files[argv[5]] = simFile{mode: "600"}
	case len(argv) == 7 && argv[0] == "/bin/sh" && argv[2] == commitScript:
		f, ok := s.files[argv[5]]
		if !ok {
			return exitWith(1, "mv: cannot stat '"+argv[5]+"': No such file or directory\n")
		}
		f.mode = argv[4]
		s.files[argv[6]] = f
		delete(s.files, argv[5])
	case argv[0] == "/bin/rm":
		for _, p := range argv[1:] {
			if !strings.HasPrefix(p, "-") {
				delete(s.files, p)
			}
		}
	case len(argv) == 3 && argv[0] == "/bin/sh" && argv[1] == "-c" && strings.Contains(argv[2], "kubectl drain"):
		s.drainStarts++
	case argv[0] == planner.LibvirtHook:
		s.hookStarts++
		if _, ok := s.files[planner.LibvirtBlobPath]; !ok {
			return exitWith(1, planner.LibvirtBlobPath+": No such file or directory\n")
		}
		s.joined = append(s.joined, argv[1])
	default:
		return exitWith(127, argv[0]+": command not found\n")
	}
	return exitWith(0, "")
}

// starts counts the starts of a guest step's command.
func (s *simQGA) starts(a planner.Action) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a == planner.ActionExecDrain {
		return s.drainStarts
	}
	return s.hookStarts
}

func (s *simQGA) state() (calls []string, hookStarts int, joined []string, files map[string]simFile) {
	s.mu.Lock()
	defer s.mu.Unlock()
	files = map[string]simFile{}
	for k, v := range s.files {
		files[k] = v
	}
	return append([]string(nil), s.calls...), s.hookStarts, append([]string(nil), s.joined...), files
}

// testAgent is one domain's guest agent over a real zoneConn.call (with a
// placeholder client the simulated send never touches).
func testAgent(t *testing.T, sim *simQGA) *guestAgent {
	t.Helper()
	cfg := Config{CallTimeout: 20 * time.Millisecond}
	cfg.defaults()
	zc := newZoneConn("z", nil, &cfg, nil, new(atomic.Int64), new(atomic.Int64))
	zc.lv = &golibvirt.Libvirt{}
	zc.gen = 1
	t.Cleanup(func() {
		select {
		case <-sim.hang:
		default:
			close(sim.hang)
		}
	})
	return &guestAgent{cfg: &cfg, zc: zc, dom: golibvirt.Domain{Name: "vm"}, send: sim.send,
		poll: retry.Policy{Initial: time.Millisecond, Max: 2 * time.Millisecond}}
}

// agentOnly drives the adapter's agent code (everything below the domain
// lookup) as the executor sees it; the executor calls nothing else for an
// exec-bootstrap step.
type agentOnly struct {
	hypervisors.Hypervisor
	ga *guestAgent
}

func (a agentOnly) AgentWriteFile(ctx context.Context, _ hypervisors.Target, p string, data []byte, mode os.FileMode) error {
	return a.ga.writeFile(ctx, p, data, mode)
}

func (a agentOnly) AgentExec(ctx context.Context, _ hypervisors.Target, argv []string) (hypervisors.ExecResult, error) {
	return a.ga.exec(ctx, argv, false)
}

func (a agentOnly) AgentRemoveFile(ctx context.Context, _ hypervisors.Target, p string) error {
	return a.ga.removeFile(ctx, p)
}

var drainStep = planner.Step{ID: "z/vm/exec-drain", Action: planner.ActionExecDrain, Target: hypervisors.Target{Zone: "z", Name: "vm"},
	Params: planner.Params{Exec: planner.DrainArgv(30)}}

var bootstrapStep = planner.Step{ID: "z/vm/exec-bootstrap", Action: planner.ActionExecBootstrap, Target: hypervisors.Target{Zone: "z", Name: "vm"},
	Params: planner.Params{Exec: []string{planner.LibvirtHook, "c-1"}, BlobPath: planner.LibvirtBlobPath}}

const testBlob = "kubeadm join 10.0.0.1:6443 --token abcdef.0123456789abcdef"

func runBootstrap(t *testing.T, sim *simQGA, deadline time.Duration) (starting int, err error) {
	t.Helper()
	return runGuestStep(t, sim, bootstrapStep, deadline)
}

func runGuestStep(t *testing.T, sim *simQGA, step planner.Step, deadline time.Duration) (starting int, err error) {
	t.Helper()
	var calls atomic.Int32
	ex := executor.New(executor.Options{Hypervisor: agentOnly{ga: testAgent(t, sim)}, Installation: "inst",
		MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond,
		Blob:         func(string, string) ([]byte, bool) { return []byte(testBlob), true },
		ExecStarting: func(context.Context, string, string, string) error { calls.Add(1); return nil }})
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	_, err = ex.Run(ctx, planner.Change{Machine: "m", Steps: []planner.Step{step}}, "op")
	return int(calls.Load()), err
}

// A fault at every QGA call of a guest step (for the bootstrap: the
// write's helper execs and their polls, file open/write/close, the hook's
// exec and each of its polls, the removal; for the drain: its exec and
// polls): the command starts at most once; only faults that make its
// start or end unknowable fail the step, with ErrOutcomeUnknown; the blob
// never stays.
func TestGuestStepAtMostOnceAtEveryCall(t *testing.T) {
	for _, step := range []planner.Step{bootstrapStep, drainStep} {
		clean := newSimQGA()
		if _, err := runGuestStep(t, clean, step, 10*time.Second); err != nil {
			t.Fatalf("%s: clean run: %v", step.Action, err)
		}
		sequence, _, _, _ := clean.state()
		if n := clean.starts(step.Action); n != 1 {
			t.Fatalf("%s: clean run: %d starts", step.Action, n)
		}
		cmdExec := slices.Index(sequence, "guest-exec "+step.Params.Exec[0])
		if step.Action == planner.ActionExecBootstrap {
			cmdExec = slices.Index(sequence, "guest-exec "+planner.LibvirtHook)
		}
		var polls []int
		for i := cmdExec + 1; cmdExec >= 0 && i < len(sequence) && sequence[i] == "guest-exec-status"; i++ {
			polls = append(polls, i)
		}
		if cmdExec < 0 || len(polls) < 2 {
			t.Fatalf("%s: want the command run and polled at least twice, sequence %v", step.Action, sequence)
		}
		final := polls[len(polls)-1]
		// unknown says which faults make the command's outcome unknowable:
		// its start request unanswered (it may or may not run), the answer
		// that reported its exit lost (qemu-ga forgets a pid once it
		// reported it), or the agent restarted while it ran.
		unknown := func(n int, k fault) bool {
			switch {
			case n == cmdExec:
				return k == faultLostBefore || k == faultLostAfter || k == faultHangAfter
			case n == final && (k == faultLostAfter || k == faultHangAfter):
				return true
			}
			return k == faultReboot && slices.Contains(polls, n)
		}
		for n, call := range sequence {
			kinds := []fault{faultNotConnected, faultLostBefore, faultLostAfter, faultReboot}
			if n == cmdExec || n == polls[0] || n == final || n == 0 {
				kinds = append(kinds, faultHangAfter) // each costs a libvirt call timeout (1 s+)
			}
			for _, k := range kinds {
				t.Run(fmt.Sprintf("%s/%02d-%s/%s", step.Action, n, call, k), func(t *testing.T) {
					t.Parallel()
					sim := newSimQGA()
					sim.faultAt = func(i int, _ string) fault {
						if i == n {
							return k
						}
						return faultNone
					}
					starting, err := runGuestStep(t, sim, step, 20*time.Second)
					_, _, joined, files := sim.state()
					started := sim.starts(step.Action)
					if started > 1 {
						t.Fatalf("the command started %d times", started)
					}
					for p := range files {
						if strings.HasPrefix(p, planner.LibvirtBlobPath) {
							t.Errorf("%s stayed in the guest", p)
						}
					}
					if starting != 1 {
						t.Errorf("ExecStarting called %d times, want 1", starting)
					}
					if !unknown(n, k) {
						if err != nil {
							t.Fatalf("err = %v, want success (the fault is retried)", err)
						}
						if started != 1 || step.Action == planner.ActionExecBootstrap && len(joined) != 1 {
							t.Errorf("%d starts, joined %v; want 1 start (and one join)", started, joined)
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
					if strings.Contains(err.Error(), testBlob) {
						t.Error("the error holds the blob")
					}
				})
			}
		}
	}
}

// A hook still running at the deadline: unknown outcome, with its pid.
func TestExecDeadlineIsUnknownOutcome(t *testing.T) {
	sim := newSimQGA()
	sim.hookPolls = 1 << 30
	_, err := runBootstrap(t, sim, 300*time.Millisecond)
	var u *hypervisors.UnknownOutcomeError
	if !errors.As(err, &u) || u.PID == 0 || !strings.Contains(err.Error(), "deadline passed") {
		t.Fatalf("err = %v, want an unknown outcome naming the pid and the deadline", err)
	}
	if _, starts, _, _ := sim.state(); starts != 1 {
		t.Errorf("hook starts = %d, want 1", starts)
	}
}

// A command to a zone whose connection is down never left this process:
// it is a retryable class, so the caller may send it again.
func TestExecOnDisconnectedZoneIsNotStarted(t *testing.T) {
	sim := newSimQGA()
	ga := testAgent(t, sim)
	ga.zc.lv = nil
	_, err := ga.exec(context.Background(), []string{planner.LibvirtHook, "c-1"}, false)
	if !hypervisors.Retryable(err) || errors.Is(err, hypervisors.ErrOutcomeUnknown) {
		t.Fatalf("err = %v, want a retryable class", err)
	}
	if calls, _, _, _ := sim.state(); len(calls) != 0 {
		t.Errorf("commands reached the agent: %v", calls)
	}
}

func TestStartRefused(t *testing.T) {
	le := func(code golibvirt.ErrorNumber, msg string) error {
		return classify("op", golibvirt.Error{Code: uint32(code), Message: msg})
	}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"agent answered an error", fmt.Errorf("x: %w", &qgaError{Class: "GenericError", Desc: "Failed to execute child process"}), true},
		{"no agent connected", le(golibvirt.ErrAgentUnresponsive, "Guest agent is not responding: QEMU guest agent is not connected"), true},
		{"domain not running", le(golibvirt.ErrOperationInvalid, "Requested operation is not valid: domain is not running"), true},
		{"agent vanished mid-command", le(golibvirt.ErrAgentUnresponsive, "Guest agent is not responding: Guest agent disappeared while executing command"), false},
		{"agent timeout", le(golibvirt.ErrAgentCommandTimeout, "Guest agent not available for now"), false},
		{"rpc timeout", fmt.Errorf("op: %w: no answer within 1s", hypervisors.ErrTransient), false},
	}
	for _, tc := range tests {
		if got := startRefused(tc.err); got != tc.want {
			t.Errorf("%s: startRefused = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The agent's error text is bounded in errors.
func TestQGAErrorIsBounded(t *testing.T) {
	e := &qgaError{Desc: strings.Repeat("x", 10000)}
	if n := len(e.Error()); n > maxAgentDesc+32 {
		t.Errorf("error is %d bytes", n)
	}
}
