package guestsim

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"sync"
)

// QGA answers qemu-ga's JSON protocol for a Guest, as libvirt's agent
// passthrough delivers it: one command in, one reply out. It knows
// guest-ping, guest-exec, guest-exec-status, guest-file-open, -write and
// -close, with qemu-ga's replies and errors (base64 output, handles, "Invalid
// parameter 'pid'"). It is safe for concurrent use.
type QGA struct {
	G *Guest

	mu      sync.Mutex
	handles map[int]string
	next    int
}

// NewQGA returns the agent of g.
func NewQGA(g *Guest) *QGA { return &QGA{G: g, handles: map[int]string{}, next: 1000} }

// Restart restarts the agent: it forgets every process and open handle.
func (q *QGA) Restart() {
	q.mu.Lock()
	q.handles = map[int]string{}
	q.mu.Unlock()
	q.G.RestartAgent()
}

func reply(v any) string {
	b, err := json.Marshal(map[string]any{"return": v})
	if err != nil {
		panic(err) // plain data
	}
	return string(b)
}

func qgaErr(desc string) string {
	b, _ := json.Marshal(map[string]any{"error": map[string]string{"class": "GenericError", "desc": desc}})
	return string(b)
}

// ExecArgs are guest-exec's arguments.
type ExecArgs struct {
	Path          string   `json:"path"`
	Arg           []string `json:"arg,omitempty"`
	CaptureOutput bool     `json:"capture-output"`
}

// Command runs one QGA command (JSON) and returns the reply (JSON).
func (q *QGA) Command(cmd string) string {
	var req struct {
		Execute   string          `json:"execute"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal([]byte(cmd), &req); err != nil {
		return qgaErr("JSON parse error")
	}
	switch req.Execute {
	case "guest-ping":
		return reply(map[string]any{})
	case "guest-exec":
		var a ExecArgs
		if err := json.Unmarshal(req.Arguments, &a); err != nil {
			return qgaErr("Invalid parameter type")
		}
		pid, err := q.G.Exec(append([]string{a.Path}, a.Arg...))
		if err != nil {
			return qgaErr(err.Error())
		}
		return reply(map[string]int{"pid": pid})
	case "guest-exec-status":
		var a struct {
			PID int `json:"pid"`
		}
		_ = json.Unmarshal(req.Arguments, &a)
		st, err := q.G.Status(a.PID)
		if err != nil {
			return qgaErr(err.Error())
		}
		if !st.Exited {
			return reply(map[string]bool{"exited": false})
		}
		out := map[string]any{"exited": true}
		if st.Signal != 0 {
			out["signal"] = st.Signal
		} else {
			out["exitcode"] = st.ExitCode
		}
		if len(st.Stdout) > 0 {
			out["out-data"] = base64.StdEncoding.EncodeToString(st.Stdout)
		}
		if len(st.Stderr) > 0 {
			out["err-data"] = base64.StdEncoding.EncodeToString(st.Stderr)
		}
		return reply(out)
	case "guest-file-open":
		var a struct{ Path, Mode string }
		_ = json.Unmarshal(req.Arguments, &a)
		if a.Mode != "w" {
			return qgaErr("unsupported mode " + a.Mode)
		}
		if err := q.G.Write(a.Path, nil); err != nil {
			return qgaErr("failed to open file '" + a.Path + "': No such file or directory")
		}
		q.mu.Lock()
		defer q.mu.Unlock()
		q.next++
		q.handles[q.next] = a.Path
		return reply(q.next)
	case "guest-file-write":
		var a struct {
			Handle int
			Buf    string `json:"buf-b64"`
		}
		_ = json.Unmarshal(req.Arguments, &a)
		q.mu.Lock()
		p, ok := q.handles[a.Handle]
		q.mu.Unlock()
		if !ok {
			return qgaErr(fmt.Sprintf("handle '%d' has not been found", a.Handle))
		}
		b, err := base64.StdEncoding.DecodeString(a.Buf)
		if err != nil {
			return qgaErr("Invalid parameter type for 'buf-b64', expected: base64")
		}
		q.G.mu.Lock()
		f := q.G.files[p]
		q.G.setFile(p, append(f.Data, b...), modeOr(f.Mode))
		q.G.mu.Unlock()
		return reply(map[string]any{"count": len(b), "eof": false})
	case "guest-file-close":
		var a struct{ Handle int }
		_ = json.Unmarshal(req.Arguments, &a)
		q.mu.Lock()
		defer q.mu.Unlock()
		if _, ok := q.handles[a.Handle]; !ok {
			return qgaErr(fmt.Sprintf("handle '%d' has not been found", a.Handle))
		}
		delete(q.handles, a.Handle)
		return reply(map[string]any{})
	}
	return qgaErr("The command " + req.Execute + " has not been found")
}

func modeOr(m os.FileMode) os.FileMode {
	if m == 0 {
		return 0o600
	}
	return m
}
