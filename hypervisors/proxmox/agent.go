package proxmox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	pxapi "github.com/luthermonson/go-proxmox"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/retry"
)

// ChunkSize is the largest raw chunk one PVE agent/file-write carries: PVE
// caps "content" at 61440 characters, and base64 makes 4 of every 3 bytes.
const ChunkSize = 61440 / 4 * 3

// assembleScript joins the chunk files of a large write into the target
// under umask 077, sets its mode, renames it into place and removes the
// chunks. Its first line is pvesim.AssembleMarker so the simulator's
// in-memory guest can recognise it; real guests run it with /bin/sh.
// Arguments: $1 mode, $2 target, $3... chunk files.
const assembleScript = `# bigfleet:assemble
set -e
m=$1; t=$2; shift 2
umask 077
cat -- "$@" > "$t.bigfleet-tmp"
chmod "$m" "$t.bigfleet-tmp"
mv -f -- "$t.bigfleet-tmp" "$t"
rm -f -- "$@"`

// AgentPing probes the guest agent; ErrAgentNotReady while it is not
// connected (or the VM not running). It never retries.
func (a *Adapter) AgentPing(ctx context.Context, t hypervisors.Target) error {
	if err := a.checkZone(t.Zone); err != nil {
		return err
	}
	if err := classify(a.vmHandle(t.Zone, t.VMID).AgentPing(ctx)); err != nil {
		return fmt.Errorf("agent ping vm %d on %s: %w", t.VMID, t.Zone, err)
	}
	return nil
}

// AgentWriteFile writes data to path in the guest. PVE's file-write has no
// append and carries at most ChunkSize bytes, so larger data is written as
// chunk files "<path>.bigfleet-part-NNN" and joined in the guest by one
// exec of a small /bin/sh script (which also applies mode); a small file
// is written directly (QGA creates new files 0600) and chmod-ed when mode
// is set. Every request is made once; the whole write is idempotent and
// the caller repeats it on a retryable error. The data never appears in
// errors or logs.
func (a *Adapter) AgentWriteFile(ctx context.Context, t hypervisors.Target, path string, data []byte, mode os.FileMode) error {
	if err := a.checkZone(t.Zone); err != nil {
		return err
	}
	if !strings.HasPrefix(path, "/") {
		return fmt.Errorf("agent write on vm %d: path %q is not absolute: %w", t.VMID, path, hypervisors.ErrInvalid)
	}
	v := a.vmHandle(t.Zone, t.VMID)
	write := func(p string, b []byte) error {
		if err := classify(v.AgentFileWrite(ctx, p, b)); err != nil {
			return fmt.Errorf("agent write %s (%d bytes) on vm %d: %w", p, len(b), t.VMID, err)
		}
		return nil
	}
	perm := fmt.Sprintf("%04o", mode.Perm())
	if len(data) <= ChunkSize {
		if err := write(path, data); err != nil {
			return err
		}
		if mode == 0 {
			return nil
		}
		return a.mustExec(ctx, t, []string{"chmod", perm, path}, "chmod "+path)
	}
	if mode == 0 {
		perm = "0600"
	}
	argv := []string{"/bin/sh", "-c", assembleScript, "bigfleet-assemble", perm, path}
	for i := 0; len(data) > 0; i++ {
		n := min(ChunkSize, len(data))
		part := fmt.Sprintf("%s.bigfleet-part-%03d", path, i)
		if err := write(part, data[:n]); err != nil {
			return err
		}
		argv = append(argv, part)
		data = data[n:]
	}
	return a.mustExec(ctx, t, argv, "assemble "+path)
}

// mustExec runs one of the adapter's idempotent helper commands.
func (a *Adapter) mustExec(ctx context.Context, t hypervisors.Target, argv []string, what string) error {
	res, err := a.exec(ctx, t, argv, true)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("agent %s on vm %d: exit %d: %s", what, t.VMID, res.ExitCode, excerpt(res.Stderr, 512))
	}
	return nil
}

// AgentRemoveFile removes a file in the guest (missing is success).
func (a *Adapter) AgentRemoveFile(ctx context.Context, t hypervisors.Target, path string) error {
	return a.mustExec(ctx, t, []string{"rm", "-f", "--", path}, "remove "+path)
}

// AgentExec runs argv in the guest at most once, with the error contract
// of hypervisors.Hypervisor.AgentExec: one exec request, then exec-status
// polled (Config.PollMin..PollMax; failed polls are polled again) until
// the process exits or ctx ends. Stdout and stderr keep their last
// OutputLimit bytes. A non-zero exit is reported in the result, not as an
// error.
func (a *Adapter) AgentExec(ctx context.Context, t hypervisors.Target, argv []string) (hypervisors.ExecResult, error) {
	return a.exec(ctx, t, argv, false)
}

// errRunning marks a status poll of a process that has not exited yet.
var errRunning = errors.New("still running")

// errPIDGone marks a pid the guest agent no longer knows: the guest or its
// agent restarted, or the answer that reported its exit was lost (QGA
// forgets a process once it reported it).
var errPIDGone = errors.New("the guest agent no longer knows the pid")

// exec is AgentExec. idempotent marks the adapter's own helper commands,
// which are safe to run again: an unknown outcome is then ErrTransient, so
// that the caller repeats the whole (idempotent) operation, instead of
// ErrOutcomeUnknown.
func (a *Adapter) exec(ctx context.Context, t hypervisors.Target, argv []string, idempotent bool) (hypervisors.ExecResult, error) {
	if err := a.checkZone(t.Zone); err != nil {
		return hypervisors.ExecResult{}, err
	}
	if len(argv) == 0 || argv[0] == "" {
		return hypervisors.ExecResult{}, fmt.Errorf("agent exec on vm %d: empty command: %w", t.VMID, hypervisors.ErrInvalid)
	}
	unknown := func(pid int, why string) error {
		if idempotent {
			return fmt.Errorf("agent exec %s on vm %d (pid %d) may have run; its outcome is unknown because %s; it is safe to repeat: %w",
				argv[0], t.VMID, pid, why, hypervisors.ErrTransient)
		}
		return fmt.Errorf("agent exec on vm %d: %w", t.VMID, &hypervisors.UnknownOutcomeError{Command: argv[0], PID: pid, Why: why})
	}
	if err := ctx.Err(); err != nil {
		return hypervisors.ExecResult{}, fmt.Errorf("agent exec %s on vm %d (not started): %w", argv[0], t.VMID, ctxErr(ctx))
	}
	base := fmt.Sprintf("/nodes/%s/qemu/%d/agent", t.Zone, t.VMID)
	var started struct {
		PID *int `json:"pid"`
	}
	// go-proxmox's AgentExec drops the server's error; call the endpoint
	// through the same client directly to keep it.
	if err := a.client.Post(ctx, base+"/exec", map[string]any{"command": argv}, &started); err != nil {
		cerr := classify(err)
		if execRefused(err, cerr) {
			return hypervisors.ExecResult{}, fmt.Errorf("agent exec %s on vm %d (not started): %w", argv[0], t.VMID, cerr)
		}
		return hypervisors.ExecResult{}, unknown(0, fmt.Sprintf("its start request failed: %v", cerr))
	}
	if started.PID == nil {
		return hypervisors.ExecResult{}, unknown(0, "the start reply carries no pid")
	}
	pid := *started.PID
	var st execStatus
	err := retry.Do(ctx, a.poll(), func(err error) bool {
		return errors.Is(err, errRunning) || hypervisors.Retryable(err)
	}, func(ctx context.Context) error {
		st = execStatus{}
		err := a.client.Get(ctx, fmt.Sprintf("%s/exec-status?pid=%d", base, pid), &st)
		if err != nil && strings.Contains(err.Error(), "Invalid parameter 'pid'") {
			return fmt.Errorf("%w: %w", errPIDGone, err)
		}
		if err := classify(err); err != nil {
			return err
		}
		if !bool(st.Exited) {
			return errRunning
		}
		return nil
	})
	switch {
	case err == nil:
	case errors.Is(err, errPIDGone):
		return hypervisors.ExecResult{}, unknown(pid, "the guest agent no longer reports it (restarted guest or agent, or its exit report was lost)")
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
	res := hypervisors.ExecResult{
		ExitCode: st.ExitCode,
		Stdout:   hypervisors.Tail([]byte(st.OutData), a.cfg.OutputLimit),
		Stderr:   hypervisors.Tail([]byte(st.ErrData), a.cfg.OutputLimit),
	}
	if st.Signal > 0 {
		res.ExitCode = 128 + st.Signal // as a shell reports a killed child
	}
	return res, nil
}

// execRefused reports whether a failed exec request proves the command
// never started: the request never left (the connection could not be
// made), PVE refused it before asking the agent (permission, validation,
// no such VM, VM or agent not running, no agent configured), or the agent
// could not spawn it. A timeout, a dropped connection or another server
// error is not proof: the agent may have received the command.
func execRefused(raw, classified error) bool {
	var op *net.OpError
	if errors.As(raw, &op) && op.Op == "dial" {
		return true
	}
	if strings.Contains(raw.Error(), "Failed to execute child process") { // QGA's spawn failure
		return true
	}
	for _, class := range []error{hypervisors.ErrPermission, hypervisors.ErrInvalid, hypervisors.ErrNotFound, hypervisors.ErrAgentNotReady} {
		if errors.Is(classified, class) {
			return true
		}
	}
	return false
}

// execStatus is PVE's exec-status answer: QGA's guest-exec-status with
// out-data/err-data decoded and every boolean turned into 1/0, so
// err-truncated (sent with any stderr output by current qemu-ga) and
// signal are numbers, which go-proxmox's AgentExecStatus (bool fields)
// fails to decode.
type execStatus struct {
	Exited       pxapi.IntOrBool `json:"exited"`
	ExitCode     int             `json:"exitcode"`
	Signal       int             `json:"signal"`
	OutData      string          `json:"out-data"`
	ErrData      string          `json:"err-data"`
	OutTruncated pxapi.IntOrBool `json:"out-truncated"`
	ErrTruncated pxapi.IntOrBool `json:"err-truncated"`
}

func excerpt(b []byte, n int) string {
	s := strings.TrimSpace(string(hypervisors.Tail(b, n)))
	if s == "" {
		return "(no stderr)"
	}
	return s
}
