package libvirt

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/bigfleet-vm/provider/hypervisors"
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

// guestAgent is the guest agent of one domain.
type guestAgent struct {
	cfg  *Config
	zc   *zoneConn
	dom  golibvirt.Domain
	send qgaSend
	// poll paces guest-exec-status polls (retry.Poll).
	poll retry.Policy
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
func (ga *guestAgent) command(ctx context.Context, execute string, args any, wait time.Duration) (ret json.RawMessage, sent bool, err error) {
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
	op := fmt.Sprintf("agent %s on %s/%s", execute, ga.zc.zone, ga.dom.Name)
	err = ga.zc.call(ctx, op, time.Duration(secs)*time.Second+ga.cfg.CallTimeout, func(l *golibvirt.Libvirt) error {
		mu.Lock()
		if abandoned {
			mu.Unlock()
			return errors.New("abandoned before sending")
		}
		began = true
		mu.Unlock()
		r, err := ga.send(l, ga.dom, string(cmd), secs)
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

func (h *Hypervisor) agentTarget(ctx context.Context, t hypervisors.Target) (*guestAgent, error) {
	zc, err := h.zone(t.Zone)
	if err != nil {
		return nil, err
	}
	dom, err := h.lookupDomain(ctx, zc, t.Name)
	if err != nil {
		return nil, err
	}
	return &guestAgent{cfg: &h.cfg, zc: zc, dom: dom, send: libvirtSend, poll: retry.Poll}, nil
}

// AgentPing implements hypervisors.Hypervisor: guest-ping bounded by
// Config.PingTimeout; ErrAgentNotReady while the agent is not connected.
func (h *Hypervisor) AgentPing(ctx context.Context, t hypervisors.Target) error {
	ga, err := h.agentTarget(ctx, t)
	if err != nil {
		return fmt.Errorf("agent ping %s: %w", t.Name, err)
	}
	if _, _, err := ga.command(ctx, "guest-ping", nil, h.cfg.PingTimeout); err != nil {
		return fmt.Errorf("agent ping %s: %w", t.Name, err)
	}
	return nil
}

// AgentExec implements hypervisors.Hypervisor: one guest-exec with
// captured output, then guest-exec-status polled (retry.Poll) until the
// process exits or ctx ends. Stdout and Stderr keep the last
// Config.MaxOutput bytes.
func (h *Hypervisor) AgentExec(ctx context.Context, t hypervisors.Target, argv []string) (hypervisors.ExecResult, error) {
	ga, err := h.agentTarget(ctx, t)
	if err != nil {
		return hypervisors.ExecResult{}, fmt.Errorf("agent exec on %s: %w", t.Name, err)
	}
	res, err := ga.exec(ctx, argv, false)
	if err != nil {
		return res, fmt.Errorf("agent exec on %s: %w", t.Name, err)
	}
	return res, nil
}

type execArgs struct {
	Path          string   `json:"path"`
	Arg           []string `json:"arg,omitempty"`
	CaptureOutput bool     `json:"capture-output"`
}

type execStatus struct {
	Exited       bool   `json:"exited"`
	ExitCode     int    `json:"exitcode"`
	Signal       int    `json:"signal"`
	OutData      string `json:"out-data"`
	ErrData      string `json:"err-data"`
	OutTruncated bool   `json:"out-truncated"`
	ErrTruncated bool   `json:"err-truncated"`
}

// errRunning marks a status poll of a process that has not exited yet.
var errRunning = errors.New("still running")

// exec runs argv at most once, with the error contract of
// hypervisors.Hypervisor.AgentExec. idempotent marks the adapter's own
// helper commands, which are safe to run again: an unknown outcome is
// then ErrTransient, so that the caller repeats the whole (idempotent)
// operation, instead of ErrOutcomeUnknown.
func (ga *guestAgent) exec(ctx context.Context, argv []string, idempotent bool) (hypervisors.ExecResult, error) {
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
	raw, sent, err := ga.command(ctx, "guest-exec", execArgs{Path: argv[0], Arg: argv[1:], CaptureOutput: true}, ga.cfg.CallTimeout)
	if err != nil {
		if !sent || startRefused(err) {
			return hypervisors.ExecResult{}, fmt.Errorf("guest-exec %s (not started): %w", argv[0], err)
		}
		return hypervisors.ExecResult{}, unknown(0, fmt.Sprintf("its start request failed: %v", err))
	}
	var started struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(raw, &started); err != nil || started.PID <= 0 {
		return hypervisors.ExecResult{}, unknown(0, "the agent's start reply carries no pid")
	}
	pid := started.PID
	var st execStatus
	err = retry.Do(ctx, ga.poll, func(err error) bool {
		return errors.Is(err, errRunning) || hypervisors.Retryable(err)
	}, func(ctx context.Context) error {
		raw, _, err := ga.command(ctx, "guest-exec-status", map[string]int{"pid": pid}, ga.cfg.CallTimeout)
		if err != nil {
			return err
		}
		st = execStatus{}
		if err := json.Unmarshal(raw, &st); err != nil {
			return fmt.Errorf("guest-exec-status %d: decode: %w: %w", pid, hypervisors.ErrTransient, err)
		}
		if !st.Exited {
			return errRunning
		}
		return nil
	})
	switch {
	case err == nil:
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
		var qe *qgaError
		if errors.As(err, &qe) {
			return hypervisors.ExecResult{}, unknown(pid, fmt.Sprintf("the guest agent no longer reports it (restarted guest or agent?): %v", qe))
		}
		return hypervisors.ExecResult{}, unknown(pid, fmt.Sprintf("its status cannot be read: %v", err))
	}
	res := hypervisors.ExecResult{ExitCode: st.ExitCode}
	if st.Signal > 0 {
		res.ExitCode = 128 + st.Signal
	}
	res.Stdout = hypervisors.Tail(decodeB64(st.OutData), ga.cfg.MaxOutput)
	res.Stderr = hypervisors.Tail(decodeB64(st.ErrData), ga.cfg.MaxOutput)
	return res, nil
}

func decodeB64(s string) []byte {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return []byte(s)
	}
	return b
}

// Guest-side helper scripts; paths travel as positional arguments, never
// spliced into the script. Both are idempotent.
const (
	// prepareScript makes the parent directory and an empty 0600 temp file
	// (so the content is never readable by others, whatever qemu-ga's
	// creation mode).
	prepareScript = `umask 077 && mkdir -p "$1" && rm -f "$2" && : > "$2" && chmod 600 "$2"`
	// commitScript sets the final mode and renames the temp file into place.
	commitScript = `chmod "$1" "$2" && mv -f "$2" "$3"`
)

// AgentWriteFile implements hypervisors.Hypervisor: the data goes to a
// 0600 temp file next to path in chunks (guest-file-open/write/close), then
// gets its mode and is renamed into place, so a reader sees the old file or
// the whole new one. It makes one attempt (the caller retries the whole,
// idempotent write). data never appears in an error or log line.
func (h *Hypervisor) AgentWriteFile(ctx context.Context, t hypervisors.Target, p string, data []byte, mode os.FileMode) error {
	if err := checkWritePath(p); err != nil {
		return fmt.Errorf("agent write on %s: %w", t.Name, err)
	}
	ga, err := h.agentTarget(ctx, t)
	if err != nil {
		return fmt.Errorf("agent write %s on %s: %w", p, t.Name, err)
	}
	if err := ga.writeFile(ctx, p, data, mode); err != nil {
		return fmt.Errorf("agent write %s on %s: %w", p, t.Name, err)
	}
	return nil
}

func checkWritePath(p string) error {
	if !path.IsAbs(p) || path.Clean(p) != p {
		return fmt.Errorf("path %q must be absolute and clean: %w", p, hypervisors.ErrInvalid)
	}
	return nil
}

func (ga *guestAgent) writeFile(ctx context.Context, p string, data []byte, mode os.FileMode) error {
	if err := checkWritePath(p); err != nil {
		return err
	}
	tmp := p + ".bf-tmp"
	if err := ga.execOK(ctx, "/bin/sh", "-c", prepareScript, "sh", path.Dir(p), tmp); err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	if err := ga.writeChunks(ctx, tmp, data); err != nil {
		rmCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ga.cfg.CallTimeout)
		defer cancel()
		_ = ga.execOK(rmCtx, "/bin/rm", "-f", tmp)
		return err
	}
	if err := ga.execOK(ctx, "/bin/sh", "-c", commitScript, "sh", fmt.Sprintf("%o", mode.Perm()), tmp, p); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

func (ga *guestAgent) writeChunks(ctx context.Context, p string, data []byte) error {
	raw, _, err := ga.command(ctx, "guest-file-open", map[string]string{"path": p, "mode": "w"}, ga.cfg.CallTimeout)
	if err != nil {
		return err
	}
	var handle int
	if err := json.Unmarshal(raw, &handle); err != nil {
		return fmt.Errorf("guest-file-open: decode handle: %w: %w", hypervisors.ErrTransient, err)
	}
	closeFile := func(c context.Context) error {
		_, _, err := ga.command(c, "guest-file-close", map[string]int{"handle": handle}, ga.cfg.CallTimeout)
		return handleLost(err)
	}
	for off := 0; off < len(data); off += chunkSize {
		chunk := data[off:min(off+chunkSize, len(data))]
		raw, _, err := ga.command(ctx, "guest-file-write", map[string]any{
			"handle": handle, "buf-b64": base64.StdEncoding.EncodeToString(chunk),
		}, ga.cfg.CallTimeout)
		if err == nil {
			var w struct {
				Count int `json:"count"`
			}
			if err = json.Unmarshal(raw, &w); err == nil && w.Count != len(chunk) {
				err = fmt.Errorf("guest-file-write: short write at offset %d (%d of %d bytes): %w", off, w.Count, len(chunk), hypervisors.ErrTransient)
			}
		}
		if err != nil {
			c, cancel := context.WithTimeout(context.WithoutCancel(ctx), ga.cfg.CallTimeout)
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

// execOK runs an idempotent helper and turns a non-zero exit into an
// error carrying the stderr tail.
func (ga *guestAgent) execOK(ctx context.Context, argv ...string) error {
	res, err := ga.exec(ctx, argv, true)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("%s exited %d: %s: %w", argv[0], res.ExitCode, strings.TrimSpace(strings.ToValidUTF8(string(hypervisors.Tail(res.Stderr, 512)), "?")), hypervisors.ErrInvalid)
	}
	return nil
}

// AgentRemoveFile implements hypervisors.Hypervisor (rm -f: a missing file
// is success). It makes one attempt; removing again is harmless.
func (h *Hypervisor) AgentRemoveFile(ctx context.Context, t hypervisors.Target, p string) error {
	if !path.IsAbs(p) {
		return fmt.Errorf("agent remove on %s: path %q must be absolute: %w", t.Name, p, hypervisors.ErrInvalid)
	}
	ga, err := h.agentTarget(ctx, t)
	if err != nil {
		return fmt.Errorf("agent remove %s on %s: %w", p, t.Name, err)
	}
	if err := ga.removeFile(ctx, p); err != nil {
		return fmt.Errorf("agent remove %s on %s: %w", p, t.Name, err)
	}
	return nil
}

func (ga *guestAgent) removeFile(ctx context.Context, p string) error {
	if !path.IsAbs(p) {
		return fmt.Errorf("path %q must be absolute: %w", p, hypervisors.ErrInvalid)
	}
	return ga.execOK(ctx, "/bin/rm", "-f", "--", p)
}
