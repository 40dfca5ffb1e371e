package libvirt

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/guest"
	"github.com/bigfleet-vm/provider/retry"
)

// chunkSize is the raw size of one guest-file-write (base64 inflates it by
// 4/3; qemu-ga and libvirt both accept well over that per message).
const chunkSize = 48 << 10

// maxAgentDesc bounds the guest agent's error text copied into an error.
const maxAgentDesc = 256

// agentRequest is one QGA command.
type agentRequest struct {
	Execute   string `json:"execute"`
	Arguments any    `json:"arguments,omitempty"`
}

// qgaSend delivers one raw QGA command to a domain's agent over a libvirt
// connection and returns libvirtd's reply. It is the seam between the
// agent protocol code and the wire: the real one is
// QEMUDomainAgentCommand; unit tests substitute a simulated agent.
type qgaSend func(l *golibvirt.Libvirt, dom golibvirt.Domain, cmd string, secs int32) (golibvirt.OptString, error)

func libvirtSend(l *golibvirt.Libvirt, dom golibvirt.Domain, cmd string, secs int32) (golibvirt.OptString, error) {
	return l.QEMUDomainAgentCommand(dom, cmd, secs, 0)
}

// qga is one domain's guest agent reached through libvirt's QGA
// passthrough: the guest.Transport of this adapter.
type qga struct {
	cfg  *Config
	zc   *zoneConn
	dom  golibvirt.Domain
	send qgaSend
}

// qgaError is an error the guest agent itself answered: it received the
// command and refused it (for guest-exec: the process was not spawned).
type qgaError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *qgaError) Error() string {
	d := e.Desc
	if len(d) > maxAgentDesc {
		d = d[:maxAgentDesc] + "…"
	}
	return "guest agent: " + strings.ToValidUTF8(d, "?")
}

// command sends one QGA command and returns the "return" member. wait
// bounds the agent's answer (seconds granularity); the libvirt call gets a
// little longer. sent is false only when the command certainly never left
// this process (the zone was disconnected, or ctx ended before the call
// began). Errors never include the arguments.
func (q *qga) command(ctx context.Context, execute string, args any, wait time.Duration) (ret json.RawMessage, sent bool, err error) {
	cmd, err := json.Marshal(agentRequest{Execute: execute, Arguments: args})
	if err != nil {
		return nil, false, fmt.Errorf("%s: marshal: %w", execute, err)
	}
	if d, ok := ctx.Deadline(); ok && time.Until(d) < wait {
		wait = time.Until(d)
	}
	secs := int32(wait.Round(time.Second) / time.Second)
	if secs < 1 {
		secs = 1
	}
	// claim decides, once, whether the call goroutine may still send:
	// after call returns an error, a goroutine that has not begun never
	// sends, so sent is exact.
	var (
		mu               sync.Mutex
		began, abandoned bool
	)
	var res golibvirt.OptString
	op := fmt.Sprintf("agent %s on %s/%s", execute, q.zc.zone, q.dom.Name)
	err = q.zc.call(ctx, op, time.Duration(secs)*time.Second+q.cfg.CallTimeout, func(l *golibvirt.Libvirt) error {
		mu.Lock()
		if abandoned {
			mu.Unlock()
			return errors.New("abandoned before sending")
		}
		began = true
		mu.Unlock()
		r, err := q.send(l, q.dom, string(cmd), secs)
		res = r
		return err
	})
	if err != nil {
		mu.Lock()
		abandoned = !began
		sent = began
		mu.Unlock()
		return nil, sent, agentError(err)
	}
	if len(res) == 0 {
		return nil, true, fmt.Errorf("%s: empty agent reply: %w", op, hypervisors.ErrTransient)
	}
	var reply struct {
		Return json.RawMessage `json:"return"`
		Error  *qgaError       `json:"error"`
	}
	if err := json.Unmarshal([]byte(res[0]), &reply); err != nil {
		return nil, true, fmt.Errorf("%s: decode reply: %w: %w", op, hypervisors.ErrTransient, err)
	}
	if reply.Error != nil {
		return nil, true, fmt.Errorf("%s: %w: %w", op, reply.Error, hypervisors.ErrInvalid)
	}
	return reply.Return, true, nil
}

// agentError refines the class of a failed agent command: an agent that is
// not connected, not responding or timing out is ErrAgentNotReady; a
// missing guest file is ErrNotFound.
func agentError(err error) error {
	msg := err.Error()
	switch {
	case errors.Is(err, hypervisors.ErrAgentNotReady):
		return err
	case isCode(err, golibvirt.ErrAgentCommandTimeout, golibvirt.ErrOperationTimeout),
		strings.Contains(msg, "not connected"), strings.Contains(msg, "not responding"),
		strings.Contains(msg, "agent is not available"):
		return fmt.Errorf("%w: %w", hypervisors.ErrAgentNotReady, err)
	case strings.Contains(msg, "No such file or directory"):
		return fmt.Errorf("%w: %w", hypervisors.ErrNotFound, err)
	}
	return err
}

// startRefused reports whether a failed guest-exec that was sent proves
// the command never started: the agent answered with an error (it did not
// spawn the process), or libvirtd refused the call before handing it to
// the agent (no such domain, domain not running, no agent connected,
// permission). A timeout, a dropped connection or any other failure is not
// proof: the agent may have received the command.
func startRefused(err error) bool {
	var qe *qgaError
	if errors.As(err, &qe) {
		return true
	}
	var le golibvirt.Error
	if !errors.As(err, &le) {
		return false
	}
	switch golibvirt.ErrorNumber(le.Code) {
	case golibvirt.ErrNoDomain, golibvirt.ErrOperationInvalid, golibvirt.ErrArgumentUnsupported,
		golibvirt.ErrAccessDenied, golibvirt.ErrOperationDenied, golibvirt.ErrAuthFailed:
		return true
	case golibvirt.ErrAgentUnresponsive:
		// qemuDomainAgentAvailable's answers, given before sending; the
		// same code also reports an agent that vanished mid-command.
		return strings.Contains(le.Message, "agent is not connected") ||
			strings.Contains(le.Message, "not available due to an error")
	}
	return false
}

// Ping implements guest.Transport: guest-ping bounded by
// Config.PingTimeout.
func (q *qga) Ping(ctx context.Context) error {
	_, _, err := q.command(ctx, "guest-ping", nil, q.cfg.PingTimeout)
	return err
}

type execArgs struct {
	Path          string   `json:"path"`
	Arg           []string `json:"arg,omitempty"`
	CaptureOutput bool     `json:"capture-output"`
}

// Exec implements guest.Transport: one guest-exec with captured output.
// It is Refused when the command never left this process or libvirtd or
// the agent refused it (startRefused).
func (q *qga) Exec(ctx context.Context, argv []string) (int, error) {
	raw, sent, err := q.command(ctx, "guest-exec", execArgs{Path: argv[0], Arg: argv[1:], CaptureOutput: true}, q.cfg.CallTimeout)
	if err != nil {
		if !sent || startRefused(err) {
			return 0, guest.Refused(err)
		}
		return 0, err
	}
	var started struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(raw, &started); err != nil {
		return 0, nil // no pid: the caller cannot follow it
	}
	return started.PID, nil
}

// execStatus is QGA's guest-exec-status answer (out-data and err-data in
// base64).
type execStatus struct {
	Exited       bool   `json:"exited"`
	ExitCode     int    `json:"exitcode"`
	Signal       int    `json:"signal"`
	OutData      string `json:"out-data"`
	ErrData      string `json:"err-data"`
	OutTruncated bool   `json:"out-truncated"`
	ErrTruncated bool   `json:"err-truncated"`
}

// Status implements guest.Transport: one guest-exec-status. qemu-ga's
// answer for a pid it does not know ("Invalid parameter 'pid'") is
// guest.ErrPIDGone.
func (q *qga) Status(ctx context.Context, pid int) (guest.Status, error) {
	raw, _, err := q.command(ctx, "guest-exec-status", map[string]int{"pid": pid}, q.cfg.CallTimeout)
	if err != nil {
		var qe *qgaError
		if errors.As(err, &qe) && strings.Contains(qe.Desc, "Invalid parameter 'pid'") {
			return guest.Status{}, fmt.Errorf("%w: %w", guest.ErrPIDGone, err)
		}
		return guest.Status{}, err
	}
	var st execStatus
	if err := json.Unmarshal(raw, &st); err != nil {
		return guest.Status{}, fmt.Errorf("guest-exec-status %d: decode: %w: %w", pid, hypervisors.ErrTransient, err)
	}
	return guest.Status{Exited: st.Exited, ExitCode: st.ExitCode, Signal: st.Signal,
		Stdout: decodeOutput(st.OutData), Stderr: decodeOutput(st.ErrData)}, nil
}

// decodeOutput decodes a captured stream. qemu-ga always sends base64;
// should a stream not decode, a note takes its place: the exit status is
// the outcome and is never dropped over its output.
func decodeOutput(s string) []byte {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return []byte("(the agent sent output that is not base64)")
	}
	return b
}

// MaxWrite implements guest.Transport: one Write streams any size through
// one handle, chunkSize bytes per guest-file-write.
func (q *qga) MaxWrite() int { return 0 }

// Write implements guest.Transport: guest-file-open (mode "w"),
// guest-file-write in chunks, guest-file-close.
func (q *qga) Write(ctx context.Context, p string, data []byte) error {
	raw, _, err := q.command(ctx, "guest-file-open", map[string]string{"path": p, "mode": "w"}, q.cfg.CallTimeout)
	if err != nil {
		return err
	}
	var handle int
	if err := json.Unmarshal(raw, &handle); err != nil {
		return fmt.Errorf("guest-file-open: decode handle: %w: %w", hypervisors.ErrTransient, err)
	}
	closeFile := func(c context.Context) error {
		_, _, err := q.command(c, "guest-file-close", map[string]int{"handle": handle}, q.cfg.CallTimeout)
		return handleLost(err)
	}
	for off := 0; off < len(data); off += chunkSize {
		chunk := data[off:min(off+chunkSize, len(data))]
		raw, _, err := q.command(ctx, "guest-file-write", map[string]any{
			"handle": handle, "buf-b64": base64.StdEncoding.EncodeToString(chunk),
		}, q.cfg.CallTimeout)
		if err == nil {
			var w struct {
				Count int `json:"count"`
			}
			if err = json.Unmarshal(raw, &w); err == nil && w.Count != len(chunk) {
				err = fmt.Errorf("guest-file-write: short write at offset %d (%d of %d bytes): %w", off, w.Count, len(chunk), hypervisors.ErrTransient)
			}
		}
		if err != nil {
			c, cancel := context.WithTimeout(context.WithoutCancel(ctx), q.cfg.CallTimeout)
			defer cancel()
			_ = closeFile(c)
			return handleLost(err)
		}
	}
	return closeFile(ctx)
}

// handleLost classes the agent's refusal of an open handle as transient:
// the agent restarted and forgot it, and the whole (idempotent) write can
// be repeated.
func handleLost(err error) error {
	var qe *qgaError
	if errors.As(err, &qe) {
		return fmt.Errorf("the guest agent lost the file handle (restarted?): %w: %w", qe, hypervisors.ErrTransient)
	}
	return err
}

// agent returns the guest agent of t's domain.
func (h *Hypervisor) agent(ctx context.Context, t hypervisors.Target) (*guest.Agent, error) {
	zc, err := h.zone(t.Zone)
	if err != nil {
		return nil, err
	}
	dom, err := h.lookupDomain(ctx, zc, t.Name)
	if err != nil {
		return nil, err
	}
	return &guest.Agent{T: &qga{cfg: &h.cfg, zc: zc, dom: dom, send: libvirtSend}, Poll: retry.Poll, MaxOutput: h.cfg.MaxOutput}, nil
}

// AgentPing implements hypervisors.Hypervisor: guest-ping bounded by
// Config.PingTimeout; ErrAgentNotReady while the agent is not connected.
func (h *Hypervisor) AgentPing(ctx context.Context, t hypervisors.Target) error {
	ga, err := h.agent(ctx, t)
	if err == nil {
		err = ga.Ping(ctx)
	}
	if err != nil {
		return fmt.Errorf("agent ping %s: %w", t.Name, err)
	}
	return nil
}

// AgentExec implements hypervisors.Hypervisor with guest.Agent.Exec: one
// guest-exec, then guest-exec-status polled (retry.Poll) until the
// process exits or ctx ends. Stdout and Stderr keep the last
// Config.MaxOutput bytes.
func (h *Hypervisor) AgentExec(ctx context.Context, t hypervisors.Target, argv []string) (hypervisors.ExecResult, error) {
	ga, err := h.agent(ctx, t)
	if err != nil {
		return hypervisors.ExecResult{}, fmt.Errorf("agent exec on %s: %w", t.Name, err)
	}
	res, err := ga.Exec(ctx, argv)
	if err != nil {
		return res, fmt.Errorf("agent exec on %s: %w", t.Name, err)
	}
	return res, nil
}

// AgentWriteFile implements hypervisors.Hypervisor with
// guest.Agent.WriteFile (atomic and private; one attempt). data never
// appears in an error or log line.
func (h *Hypervisor) AgentWriteFile(ctx context.Context, t hypervisors.Target, p string, data []byte, mode os.FileMode) error {
	if err := guest.CheckPath(p); err != nil {
		return fmt.Errorf("agent write on %s: %w", t.Name, err)
	}
	ga, err := h.agent(ctx, t)
	if err == nil {
		err = ga.WriteFile(ctx, p, data, mode)
	}
	if err != nil {
		return fmt.Errorf("agent write %s on %s: %w", p, t.Name, err)
	}
	return nil
}

// AgentRemoveFile implements hypervisors.Hypervisor (rm -f: a missing file
// is success). It makes one attempt; removing again is harmless.
func (h *Hypervisor) AgentRemoveFile(ctx context.Context, t hypervisors.Target, p string) error {
	if err := guest.CheckPath(p); err != nil {
		return fmt.Errorf("agent remove on %s: %w", t.Name, err)
	}
	ga, err := h.agent(ctx, t)
	if err == nil {
		err = ga.RemoveFile(ctx, p)
	}
	if err != nil {
		return fmt.Errorf("agent remove %s on %s: %w", p, t.Name, err)
	}
	return nil
}
