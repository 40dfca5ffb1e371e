package pvesim

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
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
var ErrBadPID = errors.New("Invalid parameter 'pid'") //lint:ignore ST1005 QGA's own wording, which the adapter matches

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

// AssembleMarker starts the first line of a shell script the MemGuest
// understands as "concatenate parts into a target": argv is
// ["/bin/sh", "-c", script, name, mode, target, part...]. Real guests run
// the script with a real shell.
const AssembleMarker = "# bigfleet:assemble"

// MemGuest is an in-memory guest agent. It records written files and runs
// a small, honest command set:
//   - "/bin/sh <path>": exits with N if the file has a line "exit N", else
//     0; a non-zero exit writes "<path>: exit N" to stderr;
//   - "rm -f [--] paths...", "chmod mode path", "true", "false", "hostname";
//   - the assemble script (AssembleMarker);
//   - commands scripted with SetCommand (matched by argv prefix), by default
//     "kubectl" succeeds.
//
// Anything else exits 127 with "command not found".
type MemGuest struct {
	mu       sync.Mutex
	files    map[string][]byte
	modes    map[string]string
	scripted []scripted
	procs    map[int]*memProc
	nextPID  int
	execs    [][]string
	polls    int // "not exited" answers of every process started
}

type scripted struct {
	prefix []string
	res    CommandResult
}

type memProc struct {
	res   CommandResult
	polls int
}

// NewMemGuest returns an empty in-memory guest.
func NewMemGuest() *MemGuest {
	return &MemGuest{files: map[string][]byte{}, modes: map[string]string{}, procs: map[int]*memProc{}, nextPID: 4242,
		scripted: []scripted{{prefix: []string{"kubectl"}, res: CommandResult{Stdout: "node drained\n"}}}}
}

// SetCommand scripts the result of every command whose argv starts with
// prefix (later calls win).
func (g *MemGuest) SetCommand(prefix []string, res CommandResult) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.scripted = append([]scripted{{prefix: prefix, res: res}}, g.scripted...)
}

// SetPolls makes every process started from now on report "not exited"
// to its first n exec-status calls (scripted commands add their own).
func (g *MemGuest) SetPolls(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.polls = n
}

// RestartAgent restarts the guest agent: it forgets every process, as
// qemu-ga does (files stay).
func (g *MemGuest) RestartAgent() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.procs = map[int]*memProc{}
}

// File returns a written file.
func (g *MemGuest) File(path string) ([]byte, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b, ok := g.files[path]
	return append([]byte(nil), b...), ok
}

// Mode returns the mode last set with chmod on path.
func (g *MemGuest) Mode(path string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.modes[path]
}

// Files lists the written paths.
func (g *MemGuest) Files() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for p := range g.files {
		out = append(out, p)
	}
	return out
}

// Execs returns every argv run so far.
func (g *MemGuest) Execs() [][]string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([][]string(nil), g.execs...)
}

func (g *MemGuest) Ping(context.Context) error { return nil }

func (g *MemGuest) OSInfo(context.Context) (map[string]any, error) {
	return map[string]any{"id": "debian", "name": "Debian GNU/Linux", "pretty-name": "Debian GNU/Linux 12 (bookworm)",
		"version": "12 (bookworm)", "version-id": "12", "kernel-release": "6.1.0-simulated",
		"kernel-version": "#1 SMP PREEMPT_DYNAMIC Debian 6.1.0-simulated", "machine": "x86_64"}, nil
}

func (g *MemGuest) FileWrite(_ context.Context, path string, data []byte) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.files[path] = append([]byte(nil), data...)
	return nil
}

var exitLine = regexp.MustCompile(`(?m)^\s*exit\s+(\d+)\s*$`)

func (g *MemGuest) run(argv []string) CommandResult {
	for _, s := range g.scripted {
		if len(argv) >= len(s.prefix) && equal(argv[:len(s.prefix)], s.prefix) {
			return s.res
		}
	}
	switch {
	case len(argv) == 2 && argv[0] == "/bin/sh":
		b, ok := g.files[argv[1]]
		if !ok {
			return CommandResult{ExitCode: 127, Stderr: fmt.Sprintf("/bin/sh: 0: cannot open %s: No such file\n", argv[1])}
		}
		code := 0
		if m := exitLine.FindAllSubmatch(b, -1); len(m) > 0 {
			code, _ = strconv.Atoi(string(m[0][1]))
		}
		if code != 0 {
			return CommandResult{ExitCode: code, Stderr: fmt.Sprintf("%s: exit %d\n", argv[1], code)}
		}
		return CommandResult{}
	case len(argv) >= 6 && argv[0] == "/bin/sh" && argv[1] == "-c" && strings.HasPrefix(argv[2], AssembleMarker):
		mode, target, parts := argv[4], argv[5], argv[6:]
		var all []byte
		for _, p := range parts {
			b, ok := g.files[p]
			if !ok {
				return CommandResult{ExitCode: 1, Stderr: "cat: " + p + ": No such file or directory\n"}
			}
			all = append(all, b...)
		}
		g.files[target] = all
		g.modes[target] = mode
		for _, p := range parts {
			delete(g.files, p)
		}
		return CommandResult{}
	case len(argv) == 3 && argv[0] == "/bin/sh" && argv[1] == "-c":
		return g.script(argv[2])
	case len(argv) >= 1 && argv[0] == "rm":
		for _, p := range argv[1:] {
			if !strings.HasPrefix(p, "-") {
				delete(g.files, p)
			}
		}
		return CommandResult{}
	case len(argv) == 3 && argv[0] == "chmod":
		if _, ok := g.files[argv[2]]; !ok {
			return CommandResult{ExitCode: 1, Stderr: "chmod: cannot access '" + argv[2] + "'\n"}
		}
		g.modes[argv[2]] = argv[1]
		return CommandResult{}
	case len(argv) == 1 && argv[0] == "true":
		return CommandResult{}
	case len(argv) == 1 && argv[0] == "false":
		return CommandResult{ExitCode: 1}
	case len(argv) == 1 && argv[0] == "hostname":
		return CommandResult{Stdout: "guest\n"}
	}
	name := ""
	if len(argv) > 0 {
		name = argv[0]
	}
	return CommandResult{ExitCode: 127, Stderr: name + ": command not found\n"}
}

// script runs a "/bin/sh -c" script the way `set -e` would: line by line,
// stopping at the first command that fails. Only simple commands are
// understood (no pipes or control flow); "set" lines and variable
// assignments are accepted as no-ops, which covers the provider's drain
// script (cordon, then drain).
func (g *MemGuest) script(src string) CommandResult {
	var out CommandResult
	for _, line := range strings.Split(src, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "set ") || assignment.MatchString(line) {
			continue
		}
		res := g.run(strings.Fields(line))
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

func (g *MemGuest) Exec(_ context.Context, argv []string, _ []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.execs = append(g.execs, append([]string(nil), argv...))
	g.nextPID++
	res := g.run(argv)
	res.Polls += g.polls
	g.procs[g.nextPID] = &memProc{res: res}
	return g.nextPID, nil
}

func (g *MemGuest) ExecStatus(_ context.Context, pid int) (ExecStatus, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p, ok := g.procs[pid]
	if !ok {
		return ExecStatus{}, ErrBadPID
	}
	if p.polls < p.res.Polls {
		p.polls++
		return ExecStatus{}, nil
	}
	delete(g.procs, pid) // QGA forgets a reaped process
	st := ExecStatus{Exited: true, ExitCode: p.res.ExitCode, Signal: p.res.Signal,
		OutTruncated: p.res.OutTruncated, ErrTruncated: p.res.ErrTruncated}
	if st.Signal != 0 {
		st.ExitCode = 0
	}
	if p.res.Stdout != "" {
		st.OutData = []byte(p.res.Stdout)
	}
	if p.res.Stderr != "" {
		st.ErrData = []byte(p.res.Stderr)
	}
	return st, nil
}
