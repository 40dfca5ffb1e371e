package pvesim

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// QGAGuest forwards guest-agent calls to a real qemu-ga listening on a
// unix socket (qemu-ga -m unix-listen -p SOCK). Because that agent runs on
// the host, paths are sandboxed: every absolute path in a file write, and
// every absolute argv element after argv[0], is moved under Root.
type QGAGuest struct {
	Socket string
	// Root is the sandbox directory ("" disables sandboxing: paths are
	// used as given, on the host).
	Root string
	// Timeout bounds one agent round trip (default 10 s).
	Timeout time.Duration

	mu sync.Mutex // qemu-ga serves one client at a time
}

// QGAError is an error answered by qemu-ga.
type QGAError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *QGAError) Error() string { return e.Class + ": " + e.Desc }

func (g *QGAGuest) sandbox(p string) string {
	if g.Root == "" || !strings.HasPrefix(p, "/") || strings.HasPrefix(p, g.Root+"/") {
		return p
	}
	return filepath.Join(g.Root, p)
}

// call runs one QGA command on a fresh connection, synchronised with
// guest-sync first so that stale replies are skipped.
func (g *QGAGuest) call(ctx context.Context, cmd string, args any, out any) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	to := g.Timeout
	if to == 0 {
		to = 10 * time.Second
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", g.Socket)
	if err != nil {
		return fmt.Errorf("dial qemu-ga: %w", err)
	}
	defer conn.Close()
	deadline := time.Now().Add(to)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = conn.SetDeadline(deadline)
	r := bufio.NewReader(conn)
	enc := json.NewEncoder(conn)

	id := rand.Int64N(1 << 40)
	if err := enc.Encode(map[string]any{"execute": "guest-sync", "arguments": map[string]any{"id": id}}); err != nil {
		return fmt.Errorf("qemu-ga guest-sync: %w", err)
	}
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return fmt.Errorf("qemu-ga guest-sync: %w", err)
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
		}
		if json.Unmarshal(line, &resp) == nil && string(resp.Return) == fmt.Sprint(id) {
			break
		}
	}
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	if err := enc.Encode(req); err != nil {
		return fmt.Errorf("qemu-ga %s: %w", cmd, err)
	}
	line, err := r.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("qemu-ga %s: %w", cmd, err)
	}
	var resp struct {
		Return json.RawMessage `json:"return"`
		Error  *QGAError       `json:"error"`
	}
	if err := json.Unmarshal(line, &resp); err != nil {
		return fmt.Errorf("qemu-ga %s: decode reply: %w", cmd, err)
	}
	if resp.Error != nil {
		return fmt.Errorf("qemu-ga %s: %w", cmd, resp.Error)
	}
	if out != nil {
		if err := json.Unmarshal(resp.Return, out); err != nil {
			return fmt.Errorf("qemu-ga %s: decode return: %w", cmd, err)
		}
	}
	return nil
}

func (g *QGAGuest) Ping(ctx context.Context) error { return g.call(ctx, "guest-ping", nil, nil) }

func (g *QGAGuest) OSInfo(ctx context.Context) (map[string]any, error) {
	var out map[string]any
	return out, g.call(ctx, "guest-get-osinfo", nil, &out)
}

// FileWrite writes through guest-file-open/write/close, like PVE does.
func (g *QGAGuest) FileWrite(ctx context.Context, path string, data []byte) error {
	p := g.sandbox(path)
	if p != path {
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return fmt.Errorf("sandbox dir: %w", err)
		}
	}
	var h int
	if err := g.call(ctx, "guest-file-open", map[string]any{"path": p, "mode": "w"}, &h); err != nil {
		return err
	}
	werr := g.call(ctx, "guest-file-write", map[string]any{"handle": h, "buf-b64": base64.StdEncoding.EncodeToString(data)}, nil)
	cerr := g.call(ctx, "guest-file-close", map[string]any{"handle": h}, nil)
	return errors.Join(werr, cerr)
}

func (g *QGAGuest) Exec(ctx context.Context, argv []string, input []byte) (int, error) {
	if len(argv) == 0 {
		return 0, errors.New("empty command")
	}
	args := make([]string, 0, len(argv)-1)
	for _, a := range argv[1:] {
		args = append(args, g.sandbox(a))
	}
	req := map[string]any{"path": argv[0], "arg": args, "capture-output": true}
	if len(input) > 0 {
		req["input-data"] = base64.StdEncoding.EncodeToString(input)
	}
	var out struct {
		PID int `json:"pid"`
	}
	if err := g.call(ctx, "guest-exec", req, &out); err != nil {
		return 0, err
	}
	return out.PID, nil
}

func (g *QGAGuest) ExecStatus(ctx context.Context, pid int) (ExecStatus, error) {
	var out struct {
		Exited       bool   `json:"exited"`
		ExitCode     int    `json:"exitcode"`
		Signal       int    `json:"signal"`
		OutData      string `json:"out-data"`
		ErrData      string `json:"err-data"`
		OutTruncated bool   `json:"out-truncated"`
		ErrTruncated bool   `json:"err-truncated"`
	}
	if err := g.call(ctx, "guest-exec-status", map[string]any{"pid": pid}, &out); err != nil {
		return ExecStatus{}, err
	}
	o, err := base64.StdEncoding.DecodeString(out.OutData)
	if err != nil {
		return ExecStatus{}, fmt.Errorf("decode out-data: %w", err)
	}
	e, err := base64.StdEncoding.DecodeString(out.ErrData)
	if err != nil {
		return ExecStatus{}, fmt.Errorf("decode err-data: %w", err)
	}
	return ExecStatus{Exited: out.Exited, ExitCode: out.ExitCode, Signal: out.Signal, OutData: o, ErrData: e,
		OutTruncated: out.OutTruncated, ErrTruncated: out.ErrTruncated}, nil
}
