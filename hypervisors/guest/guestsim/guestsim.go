package guestsim

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors/guest"
)

// ErrBadPID is the agent's answer for a pid it does not know, in
// qemu-ga's words.
var ErrBadPID = errors.New("Invalid parameter 'pid'") //lint:ignore ST1005 qemu-ga's own wording, which the adapters match

// maxExecs bounds the start log Execs returns (the most recent are kept).
const maxExecs = 4096

// maxProcs bounds the processes the agent keeps (qemu-ga keeps an exited
// one until its status is read): past it, ended ones are dropped first,
// then the oldest.
const maxProcs = 4096

// Run is how a started program runs: what it reports when it exits and
// how long it keeps running first.
type Run struct {
	ExitCode int
	// Signal, if not 0, kills the program with this signal instead.
	Signal int
	Stdout string
	Stderr string
	// OutTruncated and ErrTruncated report that the agent cut a stream at
	// its output limit.
	OutTruncated, ErrTruncated bool
	// Polls is how many status answers report it still running first.
	Polls int
	// For is how long it runs (real time) before it exits.
	For time.Duration
	// Forever: it never exits (until the guest reboots).
	Forever bool
	// Exit, if set, is called once, with the guest locked, when the
	// program is found ended (by a status request or Settle, after For);
	// what it returns replaces the result, so a program's effects can
	// happen at its end. A program that never ends (Forever, or a reboot
	// first) never calls it.
	Exit func(p *Proc) Run
}

// Program runs argv in the guest, with the guest locked: it may read and
// change files through p, and says how it runs.
type Program func(p *Proc) Run

// Programs finds the program for argv, if the embedder defines one.
type Programs func(argv []string) (Program, bool)

// Proc is a program as it starts or ends: its argv and pid, and the
// guest's files.
type Proc struct {
	g    *Guest
	Argv []string
	PID  int
	// Key is the guest-op key a wrapper runs the program under ("" when
	// it was started directly).
	Key string
}

// File returns a guest file's content.
func (p *Proc) File(path string) ([]byte, bool) {
	f, ok := p.g.files[path]
	return bytes.Clone(f.Data), ok
}

// SetFile writes a guest file with mode.
func (p *Proc) SetFile(path string, data []byte, mode os.FileMode) {
	p.g.setFile(path, data, mode)
}

// Remove removes a guest file.
func (p *Proc) Remove(path string) { p.g.remove(path) }

// File is a guest file. Data is nil after a Restore (the content is never
// saved); Sum and Size still describe it.
type File struct {
	Data []byte
	Mode os.FileMode
	Sum  string // hex SHA-256 of the content
	Size int
}

// Status is one status answer, in the agent's terms.
type Status struct {
	Exited bool
	// ExitCode is the exit status of a process that exited; Signal, if
	// not 0, is the signal that killed it instead (ExitCode is then 0).
	ExitCode     int
	Signal       int
	Stdout       []byte
	Stderr       []byte
	OutTruncated bool
	ErrTruncated bool
}

// proc is a process started through the agent.
type proc struct {
	p     *Proc
	run   Run
	start time.Time
	polls int
	done  bool // Exit ran
	// forgotten: the agent restarted since it started it; the process
	// runs on, but the agent no longer knows its pid.
	forgotten bool
}

// Guest is a simulated guest as its agent sees it: files, processes the
// agent started and forgets once it reported their exit (as qemu-ga
// does), a boot id, the helper scripts of package guest, and programs the
// embedder defines. It is safe for concurrent use.
type Guest struct {
	mu       sync.Mutex
	files    map[string]File
	procs    map[int]*proc
	nextPID  int
	boot     int
	polls    int // extra "running" answers of every process
	programs Programs
	execs    [][]string
	changed  func()
	// The wrapper's records (by records directory/key) and this boot's
	// claims (by claims directory/key: the claimant's pid).
	records map[string]*Record
	claims  map[string]int
}

// New returns an empty guest running programs (nil: only the built-in
// commands). changed, if set, is called (with the guest locked) after
// every change of a file, so an embedder can save the guest.
func New(programs Programs, changed func()) *Guest {
	return &Guest{files: map[string]File{}, procs: map[int]*proc{}, nextPID: 4000, boot: 1,
		programs: programs, changed: changed, records: map[string]*Record{}, claims: map[string]int{}}
}

func (g *Guest) touched() {
	if g.changed != nil {
		g.changed()
	}
}

func (g *Guest) setFile(path string, data []byte, mode os.FileMode) {
	sum := sha256.Sum256(data)
	g.files[path] = File{Data: bytes.Clone(data), Mode: mode, Sum: hex.EncodeToString(sum[:]), Size: len(data)}
	g.touched()
}

func (g *Guest) remove(path string) {
	if _, ok := g.files[path]; ok {
		delete(g.files, path)
		g.touched()
	}
}

// Write makes data the content of path as the agent's file write does:
// a new file is created 0600, an existing one keeps its mode.
func (g *Guest) Write(path string, data []byte) error {
	if !strings.HasPrefix(path, "/") {
		return fmt.Errorf("path %q is not absolute", path)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	mode := os.FileMode(0o600)
	if f, ok := g.files[path]; ok {
		mode = f.Mode
	}
	g.setFile(path, data, mode)
	return nil
}

// File returns a guest file.
func (g *Guest) File(path string) (File, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f, ok := g.files[path]
	f.Data = bytes.Clone(f.Data)
	return f, ok
}

// Files lists the guest's file paths, sorted.
func (g *Guest) Files() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]string, 0, len(g.files))
	for p := range g.files {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// Execs returns the argv of every process started (the most recent
// maxExecs), oldest first.
func (g *Guest) Execs() [][]string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([][]string, len(g.execs))
	for i, a := range g.execs {
		out[i] = append([]string(nil), a...)
	}
	return out
}

// Count counts the started processes whose argv match.
func (g *Guest) Count(match func(argv []string) bool) int {
	n := 0
	for _, a := range g.Execs() {
		if match(a) {
			n++
		}
	}
	return n
}

// SetPolls makes every process started from now on report "running" to
// n more status requests first.
func (g *Guest) SetPolls(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.polls = n
}

// RestartAgent restarts the agent: it forgets every process (they run on
// in the guest; their effects stay), as qemu-ga does.
func (g *Guest) RestartAgent() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for pid, pr := range g.procs {
		if pr.ended() {
			g.finish(pr)
			delete(g.procs, pid)
			continue
		}
		pr.forgotten = true
	}
}

// Settle runs the Exit of every process whose time has come, whether the
// agent is asked about it or not, and drops the ended processes the agent
// no longer knows.
func (g *Guest) Settle() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for pid, pr := range g.procs {
		if pr.ended() {
			g.finish(pr)
			if pr.forgotten {
				delete(g.procs, pid)
			}
		}
	}
}

// sweep drops ended processes, then the oldest, until at most maxProcs
// are left; g.mu is held.
func (g *Guest) sweep() {
	for pid, pr := range g.procs {
		if pr.ended() {
			g.finish(pr)
			delete(g.procs, pid)
		}
	}
	for len(g.procs) > maxProcs {
		oldest := -1
		for pid := range g.procs {
			if oldest < 0 || pid < oldest {
				oldest = pid
			}
		}
		delete(g.procs, oldest)
	}
}

// ended reports whether a process has run its course in the guest (its
// Polls only delay what the agent reports).
func (pr *proc) ended() bool {
	return !pr.run.Forever && time.Since(pr.start) >= pr.run.For
}

// Reboot reboots the guest: every process dies (a program's end effects
// never happen), the agent forgets them, files under /run and /tmp
// (tmpfs) are gone, and the boot id changes.
func (g *Guest) Reboot() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.procs = map[int]*proc{}
	g.claims = map[string]int{}
	g.boot++
	for p := range g.files {
		if strings.HasPrefix(p, "/run/") || strings.HasPrefix(p, "/tmp/") {
			delete(g.files, p)
		}
	}
	g.touched()
}

// Exec starts argv as the agent's exec does and returns its pid. The
// only error is an empty argv (the agent refuses it); a command the guest
// does not have exits 127.
func (g *Guest) Exec(argv []string) (int, error) {
	if len(argv) == 0 || argv[0] == "" {
		return 0, errors.New("Invalid parameter 'path'") //lint:ignore ST1005 qemu-ga's wording
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.logExec(argv)
	g.nextPID++
	pid := g.nextPID
	p := &Proc{g: g, Argv: append([]string(nil), argv...), PID: pid}
	start := time.Now() // before the program, which may time its own end from now
	run := g.start(p)
	run.Polls += g.polls
	g.procs[pid] = &proc{p: p, run: run, start: start}
	if len(g.procs) > maxProcs {
		g.sweep()
	}
	return pid, nil
}

// logExec records a process start; g.mu is held.
func (g *Guest) logExec(argv []string) {
	g.execs = append(g.execs, append([]string(nil), argv...))
	if len(g.execs) > maxExecs {
		g.execs = g.execs[len(g.execs)-maxExecs:]
	}
}

// finish runs a process's Exit once; g.mu is held.
func (g *Guest) finish(pr *proc) {
	if pr.done {
		return
	}
	pr.done = true
	if pr.run.Exit != nil {
		exit := pr.run.Exit
		r := exit(pr.p)
		r.Polls, r.For, r.Forever, r.Exit = pr.run.Polls, pr.run.For, pr.run.Forever, nil
		pr.run = r
	}
}

// Status answers a status request for pid: running, or its exit (after
// which the agent forgets it); ErrBadPID for a pid it does not know.
func (g *Guest) Status(pid int) (Status, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	pr, ok := g.procs[pid]
	if !ok || pr.forgotten {
		return Status{}, ErrBadPID
	}
	if !pr.ended() || pr.polls < pr.run.Polls {
		pr.polls++
		return Status{}, nil
	}
	g.finish(pr)
	delete(g.procs, pid) // qemu-ga forgets a reaped process
	st := Status{Exited: true, ExitCode: pr.run.ExitCode, Signal: pr.run.Signal,
		Stdout: bytesOrNil(pr.run.Stdout), Stderr: bytesOrNil(pr.run.Stderr),
		OutTruncated: pr.run.OutTruncated, ErrTruncated: pr.run.ErrTruncated}
	if st.Signal != 0 {
		st.ExitCode = 0
	}
	return st, nil
}

// start runs argv's program; g.mu is held.
func (g *Guest) start(p *Proc) Run {
	argv := p.Argv
	switch {
	case len(argv) >= 5 && argv[0] == "/bin/sh" && argv[1] == "-c" && argv[2] == guest.PrepareScript:
		return g.prepare(argv[4], argv[5:])
	case len(argv) >= 6 && argv[0] == "/bin/sh" && argv[1] == "-c" && argv[2] == guest.CommitScript:
		return g.commit(argv[4], argv[5], argv[6:])
	case len(argv) == 6 && argv[0] == "/bin/sh" && argv[1] == "-c" && argv[2] == guest.UnstageScript:
		for f := range g.files {
			if f == argv[4] || strings.HasPrefix(f, argv[4]+".bf-") || f == argv[5] {
				g.remove(f)
			}
		}
		return Run{}
	case isWrapper(argv):
		return g.wrapper(p)
	case argv[0] == "/bin/rm" || argv[0] == "rm":
		for _, a := range argv[1:] {
			if !strings.HasPrefix(a, "-") {
				g.remove(a)
			}
		}
		return Run{}
	}
	if g.programs != nil {
		if prog, ok := g.programs(argv); ok {
			return prog(p)
		}
	}
	return Run{ExitCode: 127, Stderr: argv[0] + ": command not found\n"}
}

func (g *Guest) prepare(dir string, parts []string) Run {
	if !strings.HasPrefix(dir, "/") {
		return Run{ExitCode: 1, Stderr: "mkdir: invalid directory\n"}
	}
	for _, p := range parts {
		g.setFile(p, nil, 0o600)
	}
	return Run{}
}

func (g *Guest) commit(mode, target string, parts []string) Run {
	var m uint32
	if _, err := fmt.Sscanf(mode, "%o", &m); err != nil {
		return Run{ExitCode: 1, Stderr: "chmod: invalid mode: '" + mode + "'\n"}
	}
	var all []byte
	for _, p := range parts {
		f, ok := g.files[p]
		if !ok {
			return Run{ExitCode: 1, Stderr: "cat: " + p + ": No such file or directory\n"}
		}
		all = append(all, f.Data...)
	}
	for _, p := range parts {
		delete(g.files, p)
	}
	g.setFile(target, all, os.FileMode(m))
	return Run{}
}

func bytesOrNil(s string) []byte {
	if s == "" {
		return nil
	}
	return []byte(s)
}

// FileInfo describes a saved file: never its content.
type FileInfo struct {
	Mode os.FileMode `json:"mode"`
	Sum  string      `json:"sha256"`
	Size int         `json:"size"`
}

// State is what of a guest survives its simulator (an embedder saves it
// and Restores from it): the boot id and the files without their
// content. Processes never survive: the agent of a restored guest knows
// none.
type State struct {
	Boot  int                 `json:"boot"`
	Files map[string]FileInfo `json:"files,omitempty"`
	// Records are the wrapper's durable records (a repeatable check's are
	// not saved).
	Records map[string]Record `json:"records,omitempty"`
}

// State returns what of g is saved.
func (g *Guest) State() State {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := State{Boot: g.boot}
	for k, r := range g.records {
		if r.repeat {
			continue
		}
		if st.Records == nil {
			st.Records = map[string]Record{}
		}
		st.Records[k] = *r
	}
	if len(g.files) > 0 {
		st.Files = make(map[string]FileInfo, len(g.files))
		for p, f := range g.files {
			st.Files[p] = FileInfo{Mode: f.Mode, Sum: f.Sum, Size: f.Size}
		}
	}
	return st
}

// Restore returns a guest as st saved it: its files are there, with
// their modes, sums and sizes but no content (Data nil).
func Restore(st State, programs Programs, changed func()) *Guest {
	g := New(programs, changed)
	if st.Boot > 0 {
		g.boot = st.Boot
	}
	for p, fi := range st.Files {
		g.files[p] = File{Mode: fi.Mode, Sum: fi.Sum, Size: fi.Size}
	}
	for k, r := range st.Records {
		g.records[k] = &r
	}
	return g
}

// Stat returns a guest file as a program sees it (Data nil when its
// content did not survive a Restore).
func (p *Proc) Stat(path string) (File, bool) {
	f, ok := p.g.files[path]
	f.Data = bytes.Clone(f.Data)
	return f, ok
}
