package providertest

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TerminateTimeout bounds how long Terminate waits for the process to
// exit after SIGTERM before it kills it and fails the test.
const TerminateTimeout = 90 * time.Second

// output is where processes write stdout and stderr: every launch
// appends a header and then its own output, so a process's part is the
// byte range [from, to) of the stream.
type output interface {
	// begin appends header and returns the writer for the next process
	// (closed by the caller once the process has started) and the
	// offset its output starts at.
	begin(header string) (w io.WriteCloser, from int, err error)
	// text is everything written so far.
	text() string
	// size is len(text()).
	size() int
}

// memOutput keeps the stream in memory.
type memOutput struct{ buf SyncBuffer }

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

func (m *memOutput) begin(header string) (io.WriteCloser, int, error) {
	m.buf.Write([]byte(header))
	return nopCloser{&m.buf}, m.buf.Len(), nil
}

func (m *memOutput) text() string { return m.buf.String() }
func (m *memOutput) size() int    { return m.buf.Len() }

// fileOutput appends the stream to a file the suite keeps. The process
// writes to the file directly, so its output survives the harness.
type fileOutput struct{ path string }

func (f *fileOutput) begin(header string) (io.WriteCloser, int, error) {
	lf, err := os.OpenFile(f.path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, 0, fmt.Errorf("open provider log: %w", err)
	}
	if _, err := lf.WriteString(header); err != nil {
		lf.Close()
		return nil, 0, fmt.Errorf("write provider log: %w", err)
	}
	fi, err := lf.Stat()
	if err != nil {
		lf.Close()
		return nil, 0, fmt.Errorf("stat provider log: %w", err)
	}
	return lf, int(fi.Size()), nil
}

func (f *fileOutput) text() string {
	b, _ := os.ReadFile(f.path)
	return string(b)
}

func (f *fileOutput) size() int {
	fi, err := os.Stat(f.path)
	if err != nil {
		return 0
	}
	return int(fi.Size())
}

// Process is one run of the provider binary. Its methods other than
// Output, Done and Exited must be called from the test's goroutine.
type Process struct {
	t    testing.TB
	argv []string
	cmd  *exec.Cmd
	out  output
	from int

	done chan struct{} // closed once the process is reaped
	// Set before done is closed; read only after.
	err error
	to  int

	raceChecked sync.Once
}

// StartProcess runs binary with exactly args, output kept in memory, and
// kills it when the test ends. It does not wait for anything: for a
// provider on harness-chosen ports with a plain-HTTP /readyz, use Start.
func StartProcess(t testing.TB, binary string, args ...string) *Process {
	t.Helper()
	p, err := startProcess(t, binary, args, nil, &memOutput{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

func startProcess(t testing.TB, binary string, args, env []string, out output) (*Process, error) {
	header := fmt.Sprintf("===== launch %s: %s %s\n", time.Now().Format(time.RFC3339Nano), binary, strings.Join(args, " "))
	w, from, err := out.begin(header)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	cmd := exec.Command(binary, args...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = w, w
	// A grandchild holding the output pipe must not block the reaping.
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start provider: %w", err)
	}
	p := &Process{t: t, argv: append([]string(nil), args...), cmd: cmd, out: out, from: from, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		p.to = out.size()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is the result of waiting for the process (nil while it runs or when
// it exited 0).
func (p *Process) Err() error {
	if !p.Exited() {
		return nil
	}
	return p.err
}

// ExitCode is the exit code, or -1 while it runs or when a signal ended
// it.
func (p *Process) ExitCode() int {
	if !p.Exited() {
		return -1
	}
	return p.cmd.ProcessState.ExitCode()
}

// Output is what this process wrote to stdout and stderr so far.
func (p *Process) Output() string {
	text := p.out.text()
	to := len(text)
	if p.Exited() && p.to < to {
		to = p.to
	}
	if p.from > to {
		return ""
	}
	return text[p.from:to]
}

// Signal sends sig; an error once the process has exited.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop pauses the process (SIGSTOP): it keeps its ports and state but
// answers nothing until Cont.
func (p *Process) Stop() {
	p.t.Helper()
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		p.t.Fatalf("SIGSTOP provider: %v", err)
	}
}

// Cont resumes a process paused by Stop (SIGCONT).
func (p *Process) Cont() {
	p.t.Helper()
	if err := p.Signal(syscall.SIGCONT); err != nil {
		p.t.Fatalf("SIGCONT provider: %v", err)
	}
}

// Kill sends SIGKILL (a crash: no graceful shutdown), even to a paused
// process, reaps it and checks its output for races. A no-op on a
// process that has exited, but for that check.
func (p *Process) Kill() {
	p.t.Helper()
	if !p.Exited() {
		_ = p.Signal(syscall.SIGKILL)
		<-p.done
	}
	p.checkRace()
}

// Terminate sends SIGTERM (and SIGCONT, so a paused process sees it),
// waits up to TerminateTimeout for the exit, checks the output for races
// and returns the exit code. A process that does not exit in time is
// killed and fails the test.
func (p *Process) Terminate() int {
	p.t.Helper()
	_ = p.Signal(syscall.SIGTERM)
	_ = p.Signal(syscall.SIGCONT)
	select {
	case <-p.done:
	case <-time.After(TerminateTimeout):
		p.Kill()
		p.t.Fatalf("provider did not exit within %v of SIGTERM\noutput:\n%s", TerminateTimeout, tail(p.Output()))
	}
	p.checkRace()
	return p.ExitCode()
}

// checkRace runs NoRace on the output once the process has exited; once
// per process.
func (p *Process) checkRace() {
	p.t.Helper()
	if !p.Exited() {
		return
	}
	p.raceChecked.Do(func() { NoRace(p.t, describe(p.argv), p.Output()) })
}

// Run runs binary with args to its exit, which must come within max, and
// returns the combined output and the exit code; the output is checked
// for races.
func Run(t testing.TB, binary string, max time.Duration, args ...string) (string, int) {
	t.Helper()
	return RunEnv(t, binary, nil, max, args...)
}

// RunEnv is Run with extra environment variables (KEY=value, after the
// test's own; see Options.Env).
func RunEnv(t testing.TB, binary string, env []string, max time.Duration, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), max)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%s did not exit on its own within %v:\n%s", describe(args), max, tail(string(out)))
	}
	if err != nil && cmd.ProcessState == nil {
		t.Fatalf("run %s: %v", describe(args), err)
	}
	NoRace(t, describe(args), string(out))
	return string(out), cmd.ProcessState.ExitCode()
}

// describe names a provider run by its arguments, bounded.
func describe(args []string) string {
	s := "provider " + strings.Join(args, " ")
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// tailMax bounds the output quoted into a failure message.
const tailMax = 64 << 10

// tail is the last tailMax bytes of s, from a line start.
func tail(s string) string {
	if len(s) <= tailMax {
		return s
	}
	s = s[len(s)-tailMax:]
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return "... (earlier output cut)\n" + s
}
