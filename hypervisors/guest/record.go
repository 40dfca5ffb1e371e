package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/retry"
)

// Runner runs commands and writes files in one guest, with the contract
// of hypervisors.Hypervisor's agent methods for one VM (Exec at most
// once, WriteFile and RemoveFile idempotent). *Agent is one.
type Runner interface {
	Exec(ctx context.Context, argv []string) (hypervisors.ExecResult, error)
	WriteFile(ctx context.Context, path string, data []byte, mode os.FileMode) error
	RemoveFile(ctx context.Context, path string) error
}

var _ Runner = VM{}

// VM is one VM's guest agent reached through its hypervisor's agent
// methods: the Runner the executor drives.
type VM struct {
	Hypervisor hypervisors.Hypervisor
	Target     hypervisors.Target
}

func (v VM) Exec(ctx context.Context, argv []string) (hypervisors.ExecResult, error) {
	return v.Hypervisor.AgentExec(ctx, v.Target, argv)
}

func (v VM) WriteFile(ctx context.Context, p string, data []byte, mode os.FileMode) error {
	return v.Hypervisor.AgentWriteFile(ctx, v.Target, p, data, mode)
}

func (v VM) RemoveFile(ctx context.Context, p string) error {
	return v.Hypervisor.AgentRemoveFile(ctx, v.Target, p)
}

// Op is a recorded guest command: run under the wrapper (Script), which
// records in the guest that it started and how it ended, under Key.
type Op struct {
	// Key names the operation in the guest (an operation id and what it
	// runs, e.g. "op-17-bootstrap"): letters, digits, '.', '_' and '-',
	// at most MaxKey bytes.
	Key  string
	Argv []string
	// Stage, if Target is set, is a file the command needs (the
	// bootstrap blob): staged in the guest under StageDir when Data is
	// known, moved to Target right before the command starts, and removed
	// when it ends. A run that finds nothing staged and has no Data is
	// ErrNotStaged.
	Stage *Stage
	// Rerun marks an idempotent command (the drain): a run that died
	// without recording its end (the guest rebooted, its runner was
	// killed) is run again under a new attempt, instead of being an
	// unknown outcome.
	Rerun bool
	// Repeat marks a read-only check run again and again under one key
	// (the readiness probe): each Run runs it once more, never while an
	// earlier run of it is still running, and nothing is fsynced.
	Repeat bool
	// Starting, if set, is called once, right before the wrapper is first
	// sent; an error stops the run (nothing was sent).
	Starting func(ctx context.Context) error
	// Delivered: the wrapper was written by an earlier Run of this
	// caller, so it is written again only if the guest lost it (a reboot
	// empties /run).
	Delivered bool
	// Retry paces repeating a request that failed with a retryable class;
	// Wait paces asking again about a command that is still running
	// elsewhere.
	Retry, Wait retry.Policy
}

// Stage is a file a recorded command needs in place when it starts.
type Stage struct {
	Target string
	Data   []byte
	// Have says Data is known (a Configure's blob is in memory only on
	// the replica that accepted it).
	Have bool
	// Staged: the caller already staged Data (StagePath); Run stages it
	// again only if the wrapper finds it missing.
	Staged bool
	// Load, if set, is asked again for Data when it is not known and the
	// guest has nothing staged (a retry of the operation may bring it),
	// for at most Grace; then Run gives up with ErrNotStaged.
	Load  func() ([]byte, bool)
	Grace time.Duration
}

// await asks Load for the data until it has it, Grace passed or ctx
// ended.
func (s *Stage) await(ctx context.Context, p retry.Policy) bool {
	if s.Load == nil {
		return false
	}
	b := p.Backoff()
	for end := time.Now().Add(s.Grace); ; {
		if data, ok := s.Load(); ok {
			s.Data, s.Have = data, true
			return true
		}
		if !time.Now().Before(end) || retry.Sleep(ctx, min(b.Next(), time.Until(end))) != nil {
			return false
		}
	}
}

// MaxKey bounds an Op key.
const MaxKey = 128

// maxAttempts bounds the attempts of one Op: a key replaced by a new
// attempt (its claimant died before starting, or an idempotent command
// died) at most this often.
const maxAttempts = 4

// Outcome is how a recorded command ended.
type Outcome struct {
	ExitCode int
	// Output is the tail of its merged stdout and stderr, as recorded
	// (OutputTail bytes at most).
	Output []byte
	// Attempt is the attempt that ran it (0: the first).
	Attempt int
}

// ErrNotStaged is a recorded command whose staged file (the bootstrap
// blob) never reached the guest, and whose data is not known here: it
// never started, and cannot be run.
var ErrNotStaged = errors.New("the staged file never reached the guest")

// StagePath is where Op key's staged file waits in the guest.
func StagePath(key string) string { return path.Join(StageDir, key) }

// UnstageScript removes a staged file, the parts a write of it may have
// left, and the place it was moved to ($1: the staged path, $2: the
// target). It is idempotent.
const UnstageScript = `rm -f -- "$1" "$1".bf-* "$2"`

// Unstage removes Op key's staged file, wherever a write or the wrapper
// left it (parts of an interrupted write included), and target. One
// attempt; the caller repeats it (it is idempotent, so an unknown outcome
// is worth repeating too).
func Unstage(ctx context.Context, r Runner, key, target string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := CheckPath(target); err != nil {
		return err
	}
	res, err := r.Exec(ctx, []string{"/bin/sh", "-c", UnstageScript, "sh", StagePath(key), target})
	if err != nil {
		return fmt.Errorf("remove staged %s: %w", target, err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("remove staged %s: exit %d: %s: %w", target, res.ExitCode, excerpt(res.Stderr, 256), hypervisors.ErrInvalid)
	}
	return nil
}

// checkKey accepts an Op key.
func checkKey(k string) error {
	if k == "" || len(k) > MaxKey {
		return fmt.Errorf("op key %q: want 1 to %d bytes: %w", k, MaxKey, hypervisors.ErrInvalid)
	}
	for _, c := range k {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("op key %q: only letters, digits, '.', '_' and '-': %w", k, hypervisors.ErrInvalid)
		}
	}
	return nil
}

// attemptKey is the key of attempt n of key.
func attemptKey(key string, n int) string {
	if n == 0 {
		return key
	}
	return key + "." + strconv.Itoa(n)
}

// Argv is the wrapper invocation for attempt n of op (prev: the attempt it
// supersedes, "" for none).
func (op *Op) argv(n int, prev string) []string {
	a := []string{"/bin/sh", WrapperPath, "run", RecordDir, ClaimDir, attemptKey(op.Key, n)}
	if op.Stage != nil && op.Stage.Target != "" {
		a = append(a, "-b", StagePath(op.Key), op.Stage.Target)
	}
	if prev != "" {
		a = append(a, "-s", prev)
	}
	if op.Repeat {
		a = append(a, "-r")
	}
	return append(append(a, "--"), op.Argv...)
}

// report is the wrapper's answer.
type report struct {
	state string // exited, running, starting, dead, lost, superseded, noblob
	arg   string
	code  int
	out   []byte
}

const reportPrefix = "bigfleet-op v1 "

// parseReport reads the wrapper's stdout.
func parseReport(stdout []byte) (report, error) {
	line, out, _ := bytes.Cut(stdout, []byte("\n"))
	rest, ok := strings.CutPrefix(string(line), reportPrefix)
	if !ok {
		return report{}, fmt.Errorf("the wrapper's report is missing (stdout starts %q)", clip(line, 80))
	}
	state, arg, _ := strings.Cut(rest, " ")
	r := report{state: state, arg: arg, out: out}
	switch state {
	case "exited":
		code, err := strconv.Atoi(strings.TrimSpace(arg))
		if err != nil {
			return report{}, fmt.Errorf("the wrapper reported exit %q", clip([]byte(arg), 20))
		}
		r.code = code
	case "running", "starting", "dead", "lost", "superseded", "noblob":
	default:
		return report{}, fmt.Errorf("the wrapper reported %q", clip(line, 80))
	}
	return r, nil
}

func clip(b []byte, n int) string {
	if len(b) > n {
		b = b[:n]
	}
	return strings.ToValidUTF8(string(b), "?")
}

// Run runs op in the guest under the wrapper at most once per attempt
// and returns how it ended, whoever started it: a record left by an
// earlier Run (a previous leader, before a restart or fail-over) is
// followed instead of starting the command again. What Run does, by what
// the wrapper reports for the current attempt:
//   - exited: the command ran to exit; its recorded status and output
//     are the outcome.
//   - never started: it runs now (the claim in the guest makes a second
//     wrapper for the same key report instead of run, so re-sending the
//     wrapper after an unknown outcome is safe).
//   - running or starting elsewhere: wait for it (Wait), until ctx ends.
//   - lost (its claimant died before starting it): a new attempt, which
//     first marks the old one superseded.
//   - dead (started, never recorded an end): a new attempt if Rerun, else
//     an *hypervisors.UnknownOutcomeError.
//   - noblob: stage the data again if known, else ErrNotStaged.
//
// A ctx that ends while the command runs is an UnknownOutcomeError. The
// wrapper itself is written (Retry) before the first run, and the staged
// file when its data is known; the staged file goes first, since only
// the caller that holds its data can send it, while any later Run can
// deliver the wrapper.
func Run(ctx context.Context, r Runner, op Op) (Outcome, error) {
	if err := checkKey(op.Key); err != nil {
		return Outcome{}, err
	}
	if len(op.Argv) == 0 || op.Argv[0] == "" {
		return Outcome{}, fmt.Errorf("empty argv: %w", hypervisors.ErrInvalid)
	}
	name := op.Argv[0]
	write := func(p string, data []byte) error {
		return retry.Do(ctx, op.Retry, hypervisors.Retryable, func(ctx context.Context) error {
			return r.WriteFile(ctx, p, data, 0o600)
		})
	}
	stage := func() error {
		if err := write(StagePath(op.Key), op.Stage.Data); err != nil {
			return fmt.Errorf("stage %s: %w", op.Stage.Target, err)
		}
		return nil
	}
	if op.Stage != nil && op.Stage.Target != "" && op.Stage.Have && !op.Stage.Staged {
		if err := stage(); err != nil {
			return Outcome{}, err
		}
	}
	deliver := func() error {
		if err := write(WrapperPath, []byte(Script)); err != nil {
			return fmt.Errorf("deliver the guest-op wrapper: %w", err)
		}
		return nil
	}
	delivered := false
	if !op.Delivered {
		if err := deliver(); err != nil {
			return Outcome{}, err
		}
		delivered = true
	}
	if op.Starting != nil {
		if err := op.Starting(ctx); err != nil {
			return Outcome{}, fmt.Errorf("not started: %w", err)
		}
	}
	var (
		attempt  int
		prev     string
		sent     bool // this Run sent a wrapper that may have started the command
		lastPID  int
		restaged int
	)
	retries, waits := op.Retry.Backoff(), op.Wait.Backoff()
	pause := func(b *retry.Backoff) error { return retry.Sleep(ctx, b.Next()) }
	for {
		if err := ctx.Err(); err != nil {
			return Outcome{}, stopped(ctx, name, lastPID, sent)
		}
		// Every call of the wrapper, the first, each retry and each
		// report poll, asks op.Retry.Before (the executor's term guard)
		// first: a replica that lost its term leaves the command to the
		// guest's record and the next leader.
		if op.Retry.Before != nil {
			if err := op.Retry.Before(); err != nil {
				return Outcome{}, err
			}
		}
		res, err := r.Exec(ctx, op.argv(attempt, prev))
		switch {
		case err == nil:
		case errors.Is(err, hypervisors.ErrOutcomeUnknown):
			// The wrapper may have run; asking again (the same argv) is
			// safe: the claim stops a second run, and it reports.
			sent = true
			var u *hypervisors.UnknownOutcomeError
			if errors.As(err, &u) && u.PID > 0 {
				lastPID = u.PID
			}
			if pause(waits) != nil {
				return Outcome{}, stopped(ctx, name, lastPID, sent)
			}
			continue
		case hypervisors.Retryable(err):
			if pause(retries) != nil {
				if sent {
					return Outcome{}, stopped(ctx, name, lastPID, sent)
				}
				return Outcome{}, fmt.Errorf("%s (not started by this run): %w", name, err)
			}
			continue
		default:
			if sent {
				return Outcome{}, &hypervisors.UnknownOutcomeError{Command: name, PID: lastPID,
					Why: fmt.Sprintf("the guest can no longer be asked about it: %v", err)}
			}
			return Outcome{}, fmt.Errorf("%s (not started): %w", name, err)
		}
		if res.ExitCode != 0 && !delivered && bytes.Contains(res.Stderr, []byte(WrapperPath)) {
			// The guest lost the wrapper: deliver it and ask again.
			if err := deliver(); err != nil {
				return Outcome{}, err
			}
			delivered = true
			continue
		}
		if res.ExitCode != 0 {
			// The wrapper failed before it could start the command (it
			// reports with exit 0 whatever the command did).
			why := fmt.Sprintf("the guest-op wrapper exited %d: %s", res.ExitCode, excerpt(append(res.Stderr, res.Stdout...), 512))
			if sent {
				return Outcome{}, &hypervisors.UnknownOutcomeError{Command: name, PID: lastPID, Why: why}
			}
			return Outcome{}, fmt.Errorf("%s (not started): %s: %w", name, why, hypervisors.ErrInvalid)
		}
		sent = true
		rep, err := parseReport(res.Stdout)
		if err != nil {
			return Outcome{}, &hypervisors.UnknownOutcomeError{Command: name, Why: err.Error()}
		}
		switch rep.state {
		case "exited":
			return Outcome{ExitCode: rep.code, Output: rep.out, Attempt: attempt}, nil
		case "running", "starting":
			if pid, err := strconv.Atoi(rep.arg); err == nil {
				lastPID = pid
			}
			if pause(waits) != nil {
				return Outcome{}, stopped(ctx, name, lastPID, true)
			}
		case "noblob":
			if op.Stage == nil || !op.Stage.Have && !op.Stage.await(ctx, op.Wait) {
				return Outcome{}, fmt.Errorf("%s (not started): %w: %w", name, ErrNotStaged, hypervisors.ErrInvalid)
			}
			if restaged++; restaged > maxAttempts {
				return Outcome{}, fmt.Errorf("%s (not started): the staged file keeps vanishing from the guest: %w", name, hypervisors.ErrInvalid)
			}
			if err := stage(); err != nil {
				return Outcome{}, err
			}
		case "superseded", "lost", "dead":
			if rep.state == "dead" && !op.Rerun {
				why := "its runner died without recording how it ended"
				if rep.arg == "rebooted" {
					why = "the guest rebooted while it ran"
				}
				return Outcome{}, &hypervisors.UnknownOutcomeError{Command: name, Why: why + " (recorded in the guest under " + attemptKey(op.Key, attempt) + ")"}
			}
			if attempt+1 >= maxAttempts {
				return Outcome{}, &hypervisors.UnknownOutcomeError{Command: name,
					Why: fmt.Sprintf("%d attempts in the guest were lost or died (last: %s %s)", maxAttempts, rep.state, rep.arg)}
			}
			prev = ""
			if rep.state != "superseded" {
				prev = attemptKey(op.Key, attempt)
			}
			attempt++
			waits.Reset()
		}
	}
}

// stopped is the error of a Run whose ctx ended.
func stopped(ctx context.Context, name string, pid int, sent bool) error {
	if !sent {
		return fmt.Errorf("%s: the guest could not be asked before the operation ended: %w: %w", name, hypervisors.ErrTransient, ctx.Err())
	}
	why := "the deadline passed before it exited"
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		why = "the operation was cancelled before it exited"
	}
	return &hypervisors.UnknownOutcomeError{Command: name, PID: pid, Why: why}
}
