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
	"github.com/bigfleet-vm/provider/hypervisors/guest"
)

// ChunkSize is the largest raw chunk one PVE agent/file-write carries: PVE
// caps "content" at 61440 characters, and base64 makes 4 of every 3 bytes.
const ChunkSize = 61440 / 4 * 3

// pveAgent is one VM's guest agent reached through PVE's agent endpoints:
// the guest.Transport of this adapter.
type pveAgent struct {
	a    *Adapter
	vm   *pxapi.VirtualMachine
	base string // /nodes/{node}/qemu/{vmid}/agent
}

func (a *Adapter) agent(t hypervisors.Target) (*guest.Agent, error) {
	if err := a.checkZone(t.Zone); err != nil {
		return nil, err
	}
	return &guest.Agent{T: &pveAgent{a: a, vm: a.vmHandle(t.Zone, t.VMID), base: fmt.Sprintf("/nodes/%s/qemu/%d/agent", t.Zone, t.VMID)},
		Poll: a.poll(), MaxOutput: a.cfg.OutputLimit}, nil
}

// Ping implements guest.Transport: POST agent/ping.
func (p *pveAgent) Ping(ctx context.Context) error { return classify(p.vm.AgentPing(ctx)) }

// Exec implements guest.Transport: POST agent/exec. go-proxmox's
// AgentExec drops the server's error, so the endpoint is called through
// the same client directly to keep it. It is Refused when execRefused
// proves the command never started.
func (p *pveAgent) Exec(ctx context.Context, argv []string) (int, error) {
	var started struct {
		PID *int `json:"pid"`
	}
	if err := p.a.client.Post(ctx, p.base+"/exec", map[string]any{"command": argv}, &started); err != nil {
		cerr := classify(err)
		if execRefused(err, cerr) {
			return 0, guest.Refused(cerr)
		}
		return 0, cerr
	}
	if started.PID == nil {
		return 0, nil
	}
	return *started.PID, nil
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

// Status implements guest.Transport: GET agent/exec-status. QGA's answer
// for a pid it does not know ("Invalid parameter 'pid'", in PVE's reason
// phrase) is guest.ErrPIDGone.
func (p *pveAgent) Status(ctx context.Context, pid int) (guest.Status, error) {
	var st execStatus
	err := p.a.client.Get(ctx, fmt.Sprintf("%s/exec-status?pid=%d", p.base, pid), &st)
	if err != nil && strings.Contains(err.Error(), "Invalid parameter 'pid'") {
		return guest.Status{}, fmt.Errorf("%w: %w", guest.ErrPIDGone, err)
	}
	if err := classify(err); err != nil {
		return guest.Status{}, err
	}
	return guest.Status{Exited: bool(st.Exited), ExitCode: st.ExitCode, Signal: st.Signal,
		Stdout: []byte(st.OutData), Stderr: []byte(st.ErrData)}, nil
}

// MaxWrite implements guest.Transport: ChunkSize per agent/file-write.
func (p *pveAgent) MaxWrite() int { return ChunkSize }

// Write implements guest.Transport: one POST agent/file-write (base64,
// encode=0).
func (p *pveAgent) Write(ctx context.Context, path string, data []byte) error {
	if len(data) > ChunkSize {
		return fmt.Errorf("agent file-write of %d bytes is over the %d-byte limit: %w", len(data), ChunkSize, hypervisors.ErrInvalid)
	}
	return classify(p.vm.AgentFileWrite(ctx, path, data))
}

// AgentPing probes the guest agent; ErrAgentNotReady while it is not
// connected (or the VM not running). It never retries.
func (a *Adapter) AgentPing(ctx context.Context, t hypervisors.Target) error {
	ga, err := a.agent(t)
	if err != nil {
		return err
	}
	if err := ga.Ping(ctx); err != nil {
		return fmt.Errorf("agent ping vm %d on %s: %w", t.VMID, t.Zone, err)
	}
	return nil
}

// AgentWriteFile writes data to path in the guest with
// guest.Agent.WriteFile: private part files of at most ChunkSize bytes
// (PVE's file-write has no append), joined, given their mode and renamed
// into place by one helper exec, so a reader sees the old file or the
// whole new one. It makes one attempt; the whole write is idempotent and
// the caller repeats it on a retryable error. The data never appears in
// errors or logs.
func (a *Adapter) AgentWriteFile(ctx context.Context, t hypervisors.Target, path string, data []byte, mode os.FileMode) error {
	ga, err := a.agent(t)
	if err == nil {
		err = ga.WriteFile(ctx, path, data, mode)
	}
	if err != nil {
		return fmt.Errorf("agent write %s on vm %d: %w", path, t.VMID, err)
	}
	return nil
}

// AgentRemoveFile removes a file in the guest (missing is success).
func (a *Adapter) AgentRemoveFile(ctx context.Context, t hypervisors.Target, path string) error {
	ga, err := a.agent(t)
	if err == nil {
		err = ga.RemoveFile(ctx, path)
	}
	if err != nil {
		return fmt.Errorf("agent remove %s on vm %d: %w", path, t.VMID, err)
	}
	return nil
}

// AgentExec runs argv in the guest at most once with guest.Agent.Exec:
// one exec request, then exec-status polled (Config.PollMin..PollMax;
// failed polls are polled again) until the process exits or ctx ends.
// Stdout and stderr keep their last OutputLimit bytes. A non-zero exit is
// reported in the result, not as an error.
func (a *Adapter) AgentExec(ctx context.Context, t hypervisors.Target, argv []string) (hypervisors.ExecResult, error) {
	ga, err := a.agent(t)
	if err != nil {
		return hypervisors.ExecResult{}, err
	}
	res, err := ga.Exec(ctx, argv)
	if err != nil {
		return res, fmt.Errorf("agent exec on vm %d: %w", t.VMID, err)
	}
	return res, nil
}
