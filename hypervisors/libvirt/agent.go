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
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/bigfleet-vm/provider/hypervisors"
)

// chunkSize is the raw size of one guest-file-write (base64 inflates it by
// 4/3; qemu-ga and libvirt both accept well over that per message).
const chunkSize = 48 << 10

// Exec status polling: 100 ms doubling to 2 s, bounded only by ctx.
const (
	execPollMin = 100 * time.Millisecond
	execPollMax = 2 * time.Second
)

// agentRequest is one QGA command.
type agentRequest struct {
	Execute   string `json:"execute"`
	Arguments any    `json:"arguments,omitempty"`
}

// agentCommand sends one QGA command to a domain and returns the "return"
// member. wait bounds the agent's answer (seconds granularity); the
// libvirt call gets a little longer. Errors never include the arguments.
func (h *Hypervisor) agentCommand(ctx context.Context, zc *zoneConn, dom golibvirt.Domain, execute string, args any, wait time.Duration) (json.RawMessage, error) {
	cmd, err := json.Marshal(agentRequest{Execute: execute, Arguments: args})
	if err != nil {
		return nil, fmt.Errorf("%s: marshal: %w", execute, err)
	}
	if d, ok := ctx.Deadline(); ok && time.Until(d) < wait {
		wait = time.Until(d)
	}
	secs := int32(wait.Round(time.Second) / time.Second)
	if secs < 1 {
		secs = 1
	}
	var res golibvirt.OptString
	op := fmt.Sprintf("agent %s on %s/%s", execute, zc.zone, dom.Name)
	err = zc.call(ctx, op, time.Duration(secs)*time.Second+h.cfg.CallTimeout, func(l *golibvirt.Libvirt) (err error) {
		res, err = l.QEMUDomainAgentCommand(dom, string(cmd), secs, 0)
		return err
	})
	if err != nil {
		return nil, agentError(err)
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("%s: empty agent reply: %w", op, hypervisors.ErrTransient)
	}
	var reply struct {
		Return json.RawMessage `json:"return"`
		Error  *struct {
			Class string `json:"class"`
			Desc  string `json:"desc"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(res[0]), &reply); err != nil {
		return nil, fmt.Errorf("%s: decode reply: %w: %w", op, hypervisors.ErrTransient, err)
	}
	if reply.Error != nil {
		return nil, fmt.Errorf("%s: %s: %w", op, reply.Error.Desc, hypervisors.ErrInvalid)
	}
	return reply.Return, nil
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

func (h *Hypervisor) agentTarget(ctx context.Context, t hypervisors.Target) (*zoneConn, golibvirt.Domain, error) {
	zc, err := h.zone(t.Zone)
	if err != nil {
		return nil, golibvirt.Domain{}, err
	}
	dom, err := h.lookupDomain(ctx, zc, t.Name)
	return zc, dom, err
}

// AgentPing implements hypervisors.Hypervisor: guest-ping bounded by
// Config.PingTimeout; ErrAgentNotReady while the agent is not connected.
func (h *Hypervisor) AgentPing(ctx context.Context, t hypervisors.Target) error {
	zc, dom, err := h.agentTarget(ctx, t)
	if err != nil {
		return fmt.Errorf("agent ping %s: %w", t.Name, err)
	}
	if _, err := h.agentCommand(ctx, zc, dom, "guest-ping", nil, h.cfg.PingTimeout); err != nil {
		return fmt.Errorf("agent ping %s: %w", t.Name, err)
	}
	return nil
}

// AgentExec implements hypervisors.Hypervisor: guest-exec with captured
// output, then guest-exec-status polled with backoff until the process
// exits or ctx ends. Stdout and Stderr keep the last Config.MaxOutput bytes.
func (h *Hypervisor) AgentExec(ctx context.Context, t hypervisors.Target, argv []string) (hypervisors.ExecResult, error) {
	zc, dom, err := h.agentTarget(ctx, t)
	if err != nil {
		return hypervisors.ExecResult{}, fmt.Errorf("agent exec on %s: %w", t.Name, err)
	}
	res, err := h.exec(ctx, zc, dom, argv)
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

func (h *Hypervisor) exec(ctx context.Context, zc *zoneConn, dom golibvirt.Domain, argv []string) (hypervisors.ExecResult, error) {
	if len(argv) == 0 || argv[0] == "" {
		return hypervisors.ExecResult{}, fmt.Errorf("empty argv: %w", hypervisors.ErrInvalid)
	}
	raw, err := h.agentCommand(ctx, zc, dom, "guest-exec", execArgs{Path: argv[0], Arg: argv[1:], CaptureOutput: true}, h.cfg.CallTimeout)
	if err != nil {
		return hypervisors.ExecResult{}, err
	}
	var started struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(raw, &started); err != nil {
		return hypervisors.ExecResult{}, fmt.Errorf("guest-exec %s: decode pid: %w", argv[0], err)
	}
	wait := execPollMin
	for {
		select {
		case <-ctx.Done():
			return hypervisors.ExecResult{}, fmt.Errorf("guest-exec %s (pid %d): %w: %w", argv[0], started.PID, hypervisors.ErrTransient, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(wait*2, execPollMax)
		raw, err := h.agentCommand(ctx, zc, dom, "guest-exec-status", map[string]int{"pid": started.PID}, h.cfg.CallTimeout)
		if err != nil {
			return hypervisors.ExecResult{}, err
		}
		var st execStatus
		if err := json.Unmarshal(raw, &st); err != nil {
			return hypervisors.ExecResult{}, fmt.Errorf("guest-exec-status %d: decode: %w", started.PID, err)
		}
		if !st.Exited {
			continue
		}
		res := hypervisors.ExecResult{ExitCode: st.ExitCode}
		if st.Signal > 0 {
			res.ExitCode = 128 + st.Signal
		}
		res.Stdout = hypervisors.Tail(decodeB64(st.OutData), h.cfg.MaxOutput)
		res.Stderr = hypervisors.Tail(decodeB64(st.ErrData), h.cfg.MaxOutput)
		return res, nil
	}
}

func decodeB64(s string) []byte {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return []byte(s)
	}
	return b
}

// Guest-side helper scripts; paths travel as positional arguments, never
// spliced into the script.
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
// the whole new one. data never appears in an error or log line.
func (h *Hypervisor) AgentWriteFile(ctx context.Context, t hypervisors.Target, p string, data []byte, mode os.FileMode) error {
	if !path.IsAbs(p) || path.Clean(p) != p {
		return fmt.Errorf("agent write on %s: path %q must be absolute and clean: %w", t.Name, p, hypervisors.ErrInvalid)
	}
	zc, dom, err := h.agentTarget(ctx, t)
	if err != nil {
		return fmt.Errorf("agent write %s on %s: %w", p, t.Name, err)
	}
	tmp := p + ".bf-tmp"
	if err := h.execOK(ctx, zc, dom, "/bin/sh", "-c", prepareScript, "sh", path.Dir(p), tmp); err != nil {
		return fmt.Errorf("agent write %s on %s: prepare: %w", p, t.Name, err)
	}
	if err := h.writeChunks(ctx, zc, dom, tmp, data); err != nil {
		rmCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.cfg.CallTimeout)
		defer cancel()
		_ = h.execOK(rmCtx, zc, dom, "/bin/rm", "-f", tmp)
		return fmt.Errorf("agent write %s on %s: %w", p, t.Name, err)
	}
	if err := h.execOK(ctx, zc, dom, "/bin/sh", "-c", commitScript, "sh", fmt.Sprintf("%o", mode.Perm()), tmp, p); err != nil {
		return fmt.Errorf("agent write %s on %s: commit: %w", p, t.Name, err)
	}
	return nil
}

func (h *Hypervisor) writeChunks(ctx context.Context, zc *zoneConn, dom golibvirt.Domain, p string, data []byte) error {
	raw, err := h.agentCommand(ctx, zc, dom, "guest-file-open", map[string]string{"path": p, "mode": "w"}, h.cfg.CallTimeout)
	if err != nil {
		return err
	}
	var handle int
	if err := json.Unmarshal(raw, &handle); err != nil {
		return fmt.Errorf("guest-file-open: decode handle: %w", err)
	}
	closeFile := func(c context.Context) error {
		_, err := h.agentCommand(c, zc, dom, "guest-file-close", map[string]int{"handle": handle}, h.cfg.CallTimeout)
		return err
	}
	for off := 0; off < len(data); off += chunkSize {
		chunk := data[off:min(off+chunkSize, len(data))]
		raw, err := h.agentCommand(ctx, zc, dom, "guest-file-write", map[string]any{
			"handle": handle, "buf-b64": base64.StdEncoding.EncodeToString(chunk),
		}, h.cfg.CallTimeout)
		if err == nil {
			var w struct {
				Count int `json:"count"`
			}
			if err = json.Unmarshal(raw, &w); err == nil && w.Count != len(chunk) {
				err = fmt.Errorf("guest-file-write: short write at offset %d (%d of %d bytes): %w", off, w.Count, len(chunk), hypervisors.ErrTransient)
			}
		}
		if err != nil {
			c, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.cfg.CallTimeout)
			defer cancel()
			_ = closeFile(c)
			return err
		}
	}
	return closeFile(ctx)
}

// execOK runs argv and turns a non-zero exit into an error carrying the
// stderr tail.
func (h *Hypervisor) execOK(ctx context.Context, zc *zoneConn, dom golibvirt.Domain, argv ...string) error {
	res, err := h.exec(ctx, zc, dom, argv)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("%s exited %d: %s: %w", argv[0], res.ExitCode, strings.TrimSpace(string(hypervisors.Tail(res.Stderr, 512))), hypervisors.ErrInvalid)
	}
	return nil
}

// AgentRemoveFile implements hypervisors.Hypervisor (rm -f: a missing file
// is success).
func (h *Hypervisor) AgentRemoveFile(ctx context.Context, t hypervisors.Target, p string) error {
	if !path.IsAbs(p) {
		return fmt.Errorf("agent remove on %s: path %q must be absolute: %w", t.Name, p, hypervisors.ErrInvalid)
	}
	zc, dom, err := h.agentTarget(ctx, t)
	if err != nil {
		return fmt.Errorf("agent remove %s on %s: %w", p, t.Name, err)
	}
	if err := h.execOK(ctx, zc, dom, "/bin/rm", "-f", "--", p); err != nil {
		return fmt.Errorf("agent remove %s on %s: %w", p, t.Name, err)
	}
	return nil
}
