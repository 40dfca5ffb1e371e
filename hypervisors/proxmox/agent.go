package proxmox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	pxapi "github.com/luthermonson/go-proxmox"

	"github.com/bigfleet-vm/provider/hypervisors"
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
// is set. The data never appears in errors or logs.
func (a *Adapter) AgentWriteFile(ctx context.Context, t hypervisors.Target, path string, data []byte, mode os.FileMode) error {
	if err := a.checkZone(t.Zone); err != nil {
		return err
	}
	if !strings.HasPrefix(path, "/") {
		return fmt.Errorf("agent write on vm %d: path %q is not absolute: %w", t.VMID, path, hypervisors.ErrInvalid)
	}
	v := a.vmHandle(t.Zone, t.VMID)
	write := func(p string, b []byte) error {
		err := a.retry(ctx, func() error { return classify(v.AgentFileWrite(ctx, p, b)) })
		if err != nil {
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

func (a *Adapter) mustExec(ctx context.Context, t hypervisors.Target, argv []string, what string) error {
	res, err := a.AgentExec(ctx, t, argv)
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

// AgentExec runs argv in the guest to exit, polling exec-status with
// backoff (PollMin doubling to PollMax) bounded only by ctx. Stdout and
// stderr keep their last OutputLimit bytes. A non-zero exit is reported in
// the result, not as an error. The start request is never retried (it is
// not idempotent).
func (a *Adapter) AgentExec(ctx context.Context, t hypervisors.Target, argv []string) (hypervisors.ExecResult, error) {
	if err := a.checkZone(t.Zone); err != nil {
		return hypervisors.ExecResult{}, err
	}
	if len(argv) == 0 {
		return hypervisors.ExecResult{}, fmt.Errorf("agent exec on vm %d: empty command: %w", t.VMID, hypervisors.ErrInvalid)
	}
	base := fmt.Sprintf("/nodes/%s/qemu/%d/agent", t.Zone, t.VMID)
	var started struct {
		PID *int `json:"pid"`
	}
	// go-proxmox's AgentExec drops the server's error; call the endpoint
	// through the same client directly to keep it.
	if err := a.client.Post(ctx, base+"/exec", map[string]any{"command": argv}, &started); err != nil {
		return hypervisors.ExecResult{}, fmt.Errorf("agent exec %s on vm %d: %w", argv[0], t.VMID, classify(err))
	}
	if started.PID == nil {
		return hypervisors.ExecResult{}, fmt.Errorf("agent exec %s on vm %d: no pid returned: %w", argv[0], t.VMID, hypervisors.ErrTransient)
	}
	pid := *started.PID
	d := a.cfg.PollMin
	for {
		var st execStatus
		err := classify(a.client.Get(ctx, fmt.Sprintf("%s/exec-status?pid=%d", base, pid), &st))
		switch {
		case err == nil && bool(st.Exited):
			res := hypervisors.ExecResult{
				ExitCode: st.ExitCode,
				Stdout:   hypervisors.Tail([]byte(st.OutData), a.cfg.OutputLimit),
				Stderr:   hypervisors.Tail([]byte(st.ErrData), a.cfg.OutputLimit),
			}
			if st.Signal > 0 {
				res.ExitCode = 128 + st.Signal // as a shell reports a killed child
			}
			return res, nil
		case err != nil && !(errors.Is(err, hypervisors.ErrTransient) || errors.Is(err, hypervisors.ErrLocked)):
			return hypervisors.ExecResult{}, fmt.Errorf("agent exec-status pid %d on vm %d: %w", pid, t.VMID, err)
		}
		if serr := sleep(ctx, d); serr != nil {
			return hypervisors.ExecResult{}, fmt.Errorf("agent exec %s on vm %d: wait for pid %d: %w", argv[0], t.VMID, pid, serr)
		}
		d = min(d*2, a.cfg.PollMax)
	}
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
