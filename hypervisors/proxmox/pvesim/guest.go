package pvesim

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/bigfleet-vm/provider/hypervisors/guest/guestsim"
)

// ExecStatus is a guest-exec-status result in QGA terms (data not yet
// base64-encoded).
type ExecStatus struct {
	Exited bool
	// ExitCode is the exit status of a process that exited; Signal, if not
	// 0, is the signal that killed it instead (QGA then sends no exitcode).
	ExitCode     int
	Signal       int
	OutData      []byte
	ErrData      []byte
	OutTruncated bool
	ErrTruncated bool
}

// Guest is the guest agent of one VM.
type Guest interface {
	Ping(ctx context.Context) error
	OSInfo(ctx context.Context) (map[string]any, error)
	FileWrite(ctx context.Context, path string, data []byte) error
	Exec(ctx context.Context, argv []string, input []byte) (int, error)
	ExecStatus(ctx context.Context, pid int) (ExecStatus, error)
}

// ErrBadPID is returned for an unknown exec pid (QGA: "Invalid parameter
// 'pid'").
var ErrBadPID = guestsim.ErrBadPID

// CommandResult is the scripted outcome of a command in a MemGuest.
type CommandResult struct {
	ExitCode int
	// Signal, if not 0, kills the command with this signal (ExitCode is
	// then not reported).
	Signal int
	Stdout string
	Stderr string
	// OutTruncated and ErrTruncated report that the agent cut the stream
	// at its output limit.
	OutTruncated, ErrTruncated bool
	// Polls is how many exec-status calls report "not exited" first.
	Polls int
}

// MemGuest is the guest agent of a simulated guest (guestsim.Guest): the
// files written through it, the processes it started (forgotten once
// their exit was reported, as QGA does), the helper scripts of package
// guest, and, for a guest made by NewMemGuest, a small, honest command
// set:
//   - "/bin/sh <path>": exits with N if the file has a line "exit N", else
//     0; a non-zero exit writes "<path>: exit N" to stderr;
//   - "/bin/sh -c <script>": simple commands line by line, stopping at the
//     first failure (set -e);
//   - "chmod mode path", "true", "false", "hostname";
//   - commands scripted with SetCommand (matched by argv prefix), by default
//     "kubectl" succeeds.
//
// Anything else exits 127 with "command not found".
type MemGuest struct {
	g *guestsim.Guest

	mu       sync.Mutex
	scripted []scripted
}

type scripted struct {
	prefix []string
	res    CommandResult
}

// NewMemGuest returns an empty in-memory guest.
func NewMemGuest() *MemGuest {
	m := &MemGuest{scripted: []scripted{{prefix: []string{"kubectl"}, res: CommandResult{Stdout: "node drained\n"}}}}
	m.g = guestsim.New(m.program, nil)
	return m
}

// AgentOf returns the agent of a simulated guest made elsewhere (its
// programs are its own).
func AgentOf(g *guestsim.Guest) *MemGuest { return &MemGuest{g: g} }

// Sim returns the simulated guest behind the agent.
func (m *MemGuest) Sim() *guestsim.Guest { return m.g }

// SetCommand scripts the result of every command whose argv starts with
// prefix (later calls win).
func (m *MemGuest) SetCommand(prefix []string, res CommandResult) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.scripted = append([]scripted{{prefix: prefix, res: res}}, m.scripted...)
}

// SetPolls makes every process started from now on report "not exited"
// to its first n exec-status calls (scripted commands add their own).
func (m *MemGuest) SetPolls(n int) { m.g.SetPolls(n) }

// RestartAgent restarts the guest agent: it forgets every process, as
// qemu-ga does (files stay).
func (m *MemGuest) RestartAgent() { m.g.RestartAgent() }

// File returns a written file.
func (m *MemGuest) File(path string) ([]byte, bool) {
	f, ok := m.g.File(path)
	return f.Data, ok
}

// Mode returns a file's mode in octal ("0600"), or "" if it is missing.
func (m *MemGuest) Mode(path string) string {
	f, ok := m.g.File(path)
	if !ok {
		return ""
	}
	return fmt.Sprintf("%04o", f.Mode.Perm())
}

// Files lists the written paths.
func (m *MemGuest) Files() []string { return m.g.Files() }

// Execs returns every argv run so far (the most recent few thousand).
func (m *MemGuest) Execs() [][]string { return m.g.Execs() }

func (m *MemGuest) Ping(context.Context) error { return nil }

func (m *MemGuest) OSInfo(context.Context) (map[string]any, error) {
	return map[string]any{"id": "debian", "name": "Debian GNU/Linux", "pretty-name": "Debian GNU/Linux 12 (bookworm)",
		"version": "12 (bookworm)", "version-id": "12", "kernel-release": "6.1.0-simulated",
		"kernel-version": "#1 SMP PREEMPT_DYNAMIC Debian 6.1.0-simulated", "machine": "x86_64"}, nil
}

func (m *MemGuest) FileWrite(_ context.Context, path string, data []byte) error {
	return m.g.Write(path, data)
}

func (m *MemGuest) Exec(_ context.Context, argv []string, _ []byte) (int, error) {
	return m.g.Exec(argv)
}

func (m *MemGuest) ExecStatus(_ context.Context, pid int) (ExecStatus, error) {
	st, err := m.g.Status(pid)
	if err != nil {
		return ExecStatus{}, err
	}
	return ExecStatus{Exited: st.Exited, ExitCode: st.ExitCode, Signal: st.Signal, OutData: st.Stdout, ErrData: st.Stderr,
		OutTruncated: st.OutTruncated, ErrTruncated: st.ErrTruncated}, nil
}

func toRun(r CommandResult) guestsim.Run {
	return guestsim.Run{ExitCode: r.ExitCode, Signal: r.Signal, Stdout: r.Stdout, Stderr: r.Stderr,
		OutTruncated: r.OutTruncated, ErrTruncated: r.ErrTruncated, Polls: r.Polls}
}

// program is the command set of a MemGuest; it runs with the guest
// locked.
func (m *MemGuest) program(argv []string) (guestsim.Program, bool) {
	return func(p *guestsim.Proc) guestsim.Run { return toRun(m.run(p, argv)) }, true
}

var exitLine = regexp.MustCompile(`(?m)^\s*exit\s+(\d+)\s*$`)

func (m *MemGuest) run(p *guestsim.Proc, argv []string) CommandResult {
	m.mu.Lock()
	sc := m.scripted
	m.mu.Unlock()
	for _, s := range sc {
		if len(argv) >= len(s.prefix) && equal(argv[:len(s.prefix)], s.prefix) {
			return s.res
		}
	}
	switch {
	case len(argv) == 2 && argv[0] == "/bin/sh":
		b, ok := p.File(argv[1])
		if !ok {
			return CommandResult{ExitCode: 127, Stderr: fmt.Sprintf("/bin/sh: 0: cannot open %s: No such file\n", argv[1])}
		}
		code := 0
		if mm := exitLine.FindAllSubmatch(b, -1); len(mm) > 0 {
			code, _ = strconv.Atoi(string(mm[0][1]))
		}
		if code != 0 {
			return CommandResult{ExitCode: code, Stderr: fmt.Sprintf("%s: exit %d\n", argv[1], code)}
		}
		return CommandResult{}
	case len(argv) == 3 && argv[0] == "/bin/sh" && argv[1] == "-c":
		return m.script(p, argv[2])
	case len(argv) == 3 && argv[0] == "chmod":
		b, ok := p.File(argv[2])
		if !ok {
			return CommandResult{ExitCode: 1, Stderr: "chmod: cannot access '" + argv[2] + "'\n"}
		}
		var mode uint32
		if _, err := fmt.Sscanf(argv[1], "%o", &mode); err != nil {
			return CommandResult{ExitCode: 1, Stderr: "chmod: invalid mode: '" + argv[1] + "'\n"}
		}
		p.SetFile(argv[2], b, fsMode(mode))
		return CommandResult{}
	case len(argv) == 1 && argv[0] == "true":
		return CommandResult{}
	case len(argv) == 1 && argv[0] == "false":
		return CommandResult{ExitCode: 1}
	case len(argv) == 1 && argv[0] == "hostname":
		return CommandResult{Stdout: "guest\n"}
	}
	return CommandResult{ExitCode: 127, Stderr: argv[0] + ": command not found\n"}
}

// script runs a "/bin/sh -c" script the way `set -e` would: line by line,
// stopping at the first command that fails. Only simple commands are
// understood (no pipes or control flow); "set" lines and variable
// assignments are accepted as no-ops, which covers the provider's drain
// script (cordon, then drain).
func (m *MemGuest) script(p *guestsim.Proc, src string) CommandResult {
	var out CommandResult
	for _, line := range strings.Split(src, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "set ") || assignment.MatchString(line) {
			continue
		}
		res := m.run(p, strings.Fields(line))
		out.Stdout += res.Stdout
		out.Stderr += res.Stderr
		if res.ExitCode != 0 {
			out.ExitCode = res.ExitCode
			return out
		}
	}
	return out
}

var assignment = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func fsMode(m uint32) os.FileMode { return os.FileMode(m).Perm() }
