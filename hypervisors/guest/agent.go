package guest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/retry"
)

// DefaultMaxOutput bounds the stdout and stderr tails Exec keeps when
// Agent.MaxOutput is 0.
const DefaultMaxOutput = 64 << 10

// cleanupTimeout bounds removing the part files of a failed write, which
// runs even when the write's context is done.
const cleanupTimeout = 10 * time.Second

// Agent runs the guest-command protocol over one VM's Transport: it is
// what an adapter's AgentPing, AgentExec, AgentWriteFile and
// AgentRemoveFile do. A zero Poll paces status polls with retry.Poll.
type Agent struct {
	T Transport
	// Poll paces exec-status polls of a running process (progress checks,
	// not retries).
	Poll retry.Policy
	// MaxOutput bounds the stdout and stderr tails of an ExecResult
	// (default DefaultMaxOutput).
	MaxOutput int
}

// Ping asks the agent whether it answers.
func (a *Agent) Ping(ctx context.Context) error { return a.T.Ping(ctx) }

// Exec runs argv in the guest at most once, with the error contract of
// hypervisors.Hypervisor.AgentExec: one start request, never repeated,
// then status polls (a failed poll of a retryable class is polled again)
// until the process exits or ctx ends.
func (a *Agent) Exec(ctx context.Context, argv []string) (hypervisors.ExecResult, error) {
	return a.exec(ctx, argv, false)
}

// errRunning marks a status poll of a process that has not exited yet.
var errRunning = errors.New("still running")

// exec is Exec. idempotent marks the protocol's own helper commands,
// which are safe to run again: an unknown outcome is then ErrTransient,
// so that the caller repeats the whole (idempotent) operation, instead
// of ErrOutcomeUnknown.
func (a *Agent) exec(ctx context.Context, argv []string, idempotent bool) (hypervisors.ExecResult, error) {
	if len(argv) == 0 || argv[0] == "" {
		return hypervisors.ExecResult{}, fmt.Errorf("empty argv: %w", hypervisors.ErrInvalid)
	}
	unknown := func(pid int, why string) error {
		if idempotent {
			return fmt.Errorf("%s (pid %d) may have run; its outcome is unknown because %s; it is safe to repeat: %w",
				argv[0], pid, why, hypervisors.ErrTransient)
		}
		return &hypervisors.UnknownOutcomeError{Command: argv[0], PID: pid, Why: why}
	}
	if err := ctx.Err(); err != nil {
		return hypervisors.ExecResult{}, fmt.Errorf("%s (not started): %w: %w", argv[0], hypervisors.ErrTransient, err)
	}
	pid, err := a.T.Exec(ctx, argv)
	if err != nil {
		if IsRefused(err) {
			return hypervisors.ExecResult{}, fmt.Errorf("%s (not started): %w", argv[0], err)
		}
		return hypervisors.ExecResult{}, unknown(0, fmt.Sprintf("its start request failed: %v", err))
	}
	if pid <= 0 {
		return hypervisors.ExecResult{}, unknown(0, "the agent's start reply carries no pid")
	}
	var st Status
	err = retry.Do(ctx, a.Poll, func(err error) bool {
		return errors.Is(err, errRunning) || !errors.Is(err, ErrPIDGone) && hypervisors.Retryable(err)
	}, func(ctx context.Context) error {
		s, err := a.T.Status(ctx, pid)
		if err != nil {
			return err
		}
		if !s.Exited {
			return errRunning
		}
		st = s
		return nil
	})
	switch {
	case err == nil:
	case errors.Is(err, ErrPIDGone):
		return hypervisors.ExecResult{}, unknown(pid, fmt.Sprintf("the guest agent no longer reports it (restarted guest or agent, or its exit report was lost): %v", err))
	case ctx.Err() != nil:
		why := "the deadline passed before it exited"
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			why = "the operation was cancelled before it exited"
		}
		if last := retry.Last(err); last != nil && !errors.Is(last, errRunning) {
			why += fmt.Sprintf(" (last status poll: %v)", last)
		}
		return hypervisors.ExecResult{}, unknown(pid, why)
	default:
		return hypervisors.ExecResult{}, unknown(pid, fmt.Sprintf("its status cannot be read: %v", err))
	}
	limit := a.MaxOutput
	if limit <= 0 {
		limit = DefaultMaxOutput
	}
	res := hypervisors.ExecResult{
		ExitCode: st.ExitCode,
		Stdout:   hypervisors.Tail(st.Stdout, limit),
		Stderr:   hypervisors.Tail(st.Stderr, limit),
	}
	if st.Signal > 0 {
		res.ExitCode = 128 + st.Signal // as a shell reports a killed child
	}
	return res, nil
}

// execOK runs one of the protocol's idempotent helper commands and turns a
// non-zero exit into an error (ErrInvalid) carrying its stderr tail.
func (a *Agent) execOK(ctx context.Context, what string, argv ...string) error {
	res, err := a.exec(ctx, argv, true)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("%s: exit %d: %s: %w", what, res.ExitCode, excerpt(res.Stderr, 512), hypervisors.ErrInvalid)
	}
	return nil
}

func excerpt(b []byte, n int) string {
	s := strings.TrimSpace(strings.ToValidUTF8(string(hypervisors.Tail(b, n)), "?"))
	if s == "" {
		return "(no stderr)"
	}
	return s
}

// The helper scripts of WriteFile. Paths travel as positional
// arguments, never spliced into a script; both are idempotent. Simulated
// guests recognise them by their text.
const (
	// PrepareScript makes the target's directory and empty 0600 part
	// files ($1: the directory, $2...: the parts), so that what is
	// written is never readable by others, whatever mode the agent
	// creates files with.
	PrepareScript = `umask 077 && d=$1 && shift && mkdir -p -- "$d" && for f do rm -f -- "$f" && : > "$f" && chmod 600 -- "$f" || exit 1; done`
	// CommitScript joins the parts into a temporary file next to the
	// target (one part is used as it is), sets its mode and renames it
	// into place, so a reader sees the old file or the whole new one ($1:
	// the octal mode, $2: the target, $3...: the parts).
	CommitScript = `umask 077 && m=$1 && t=$2 && shift 2 && if [ $# -eq 1 ]; then p=$1; else p=$t.bf-tmp && cat -- "$@" > "$p" && rm -f -- "$@"; fi && chmod "$m" "$p" && mv -f -- "$p" "$t"`
)

// CheckPath accepts an absolute, clean guest path.
func CheckPath(p string) error {
	if !path.IsAbs(p) || path.Clean(p) != p {
		return fmt.Errorf("path %q must be absolute and clean: %w", p, hypervisors.ErrInvalid)
	}
	return nil
}

// Parts names the files WriteFile writes data of n bytes through, for a
// transport carrying at most max bytes per write (0: no limit).
func Parts(target string, n, max int) []string {
	if max <= 0 || n <= max {
		return []string{target + ".bf-tmp"}
	}
	parts := make([]string, 0, (n+max-1)/max)
	for i := 0; i*max < n; i++ {
		parts = append(parts, fmt.Sprintf("%s.bf-part-%03d", target, i))
	}
	return parts
}

// WriteFile makes data the content of path with mode (0 means 0600),
// atomically and privately: empty 0600 part files are prepared next to
// path (PrepareScript), the data goes into them (at most MaxWrite per
// part), and CommitScript joins them, sets the mode and renames the
// result into place. A reader sees the old file or the whole new one;
// nobody else can read the data on its way. It makes one attempt; the
// whole write is idempotent, so the caller repeats it after a retryable
// error. data never appears in an error.
func (a *Agent) WriteFile(ctx context.Context, p string, data []byte, mode os.FileMode) error {
	if err := CheckPath(p); err != nil {
		return err
	}
	if mode.Perm() == 0 {
		mode = 0o600
	}
	max := a.T.MaxWrite()
	parts := Parts(p, len(data), max)
	prep := append([]string{"/bin/sh", "-c", PrepareScript, "sh", path.Dir(p)}, parts...)
	if err := a.execOK(ctx, "prepare", prep...); err != nil {
		return err
	}
	// A part left behind holds (some of) the data: remove them on any
	// failure, even when ctx is done.
	cleanup := func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = a.execOK(rctx, "clean up", append([]string{"/bin/rm", "-f", "--"}, parts...)...)
	}
	for i, part := range parts {
		chunk := data
		if len(parts) > 1 {
			chunk = data[i*max : min((i+1)*max, len(data))]
		}
		if err := a.T.Write(ctx, part, chunk); err != nil {
			cleanup()
			return fmt.Errorf("write %s (%d bytes): %w", part, len(chunk), err)
		}
	}
	commit := append([]string{"/bin/sh", "-c", CommitScript, "sh", fmt.Sprintf("%o", mode.Perm()), p}, parts...)
	if err := a.execOK(ctx, "commit", commit...); err != nil {
		cleanup()
		return err
	}
	return nil
}

// RemoveFile removes a guest file; a missing file is success. It makes
// one attempt; removing again is harmless.
func (a *Agent) RemoveFile(ctx context.Context, p string) error {
	if err := CheckPath(p); err != nil {
		return err
	}
	return a.execOK(ctx, "remove", "/bin/rm", "-f", "--", p)
}
