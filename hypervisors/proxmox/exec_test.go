package proxmox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/executor"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvesim"
	"github.com/bigfleet-vm/provider/planner"
)

// reqFault is what the simulated PVE does to one request.
type reqFault int

const (
	reqNone reqFault = iota
	// req500: a 500 before PVE did anything.
	req500
	// reqAgentDown: PVE's "QEMU guest agent is not running", before
	// asking the agent.
	reqAgentDown
	// reqDropBefore: the connection drops before PVE did anything.
	reqDropBefore
	// reqLostAfter: PVE did it, then the connection dropped.
	reqLostAfter
	// reqRestartAgent: the guest agent restarted just before (it forgets
	// every pid).
	reqRestartAgent
)

func (f reqFault) String() string {
	return [...]string{"none", "500", "agent-down", "drop-before", "lost-after", "restart-agent"}[f]
}

func drop(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if c, _, err := hj.Hijack(); err == nil {
			c.Close()
		}
	}
}

// faultAt returns a RequestHook that applies f to the n-th request (from
// 0) and records every request as "METHOD /path".
func faultAt(n int, f reqFault, g *pvesim.MemGuest) (pvesim.RequestHook, func() []string) {
	var mu sync.Mutex
	var seen []string
	return func(w http.ResponseWriter, r *http.Request, serve func(http.ResponseWriter)) {
			key := r.Method + " " + strings.TrimPrefix(r.URL.Path, "/api2/json")
			if strings.HasSuffix(key, "/agent/exec") {
				// Name the command: peek at the body and put it back.
				b, _ := io.ReadAll(r.Body)
				r.Body = io.NopCloser(bytes.NewReader(b))
				var req struct{ Command []string }
				_ = json.Unmarshal(b, &req)
				if len(req.Command) > 0 {
					key += " " + req.Command[0]
				}
				if len(req.Command) > 1 {
					key += " " + req.Command[1]
				}
			}
			mu.Lock()
			i := len(seen)
			seen = append(seen, key)
			mu.Unlock()
			if i != n {
				serve(w)
				return
			}
			switch f {
			case req500:
				w.WriteHeader(500)
			case reqAgentDown:
				writeReason(w, 500, "QEMU guest agent is not running")
			case reqDropBefore:
				drop(w)
			case reqLostAfter:
				serve(httptest.NewRecorder())
				drop(w)
			case reqRestartAgent:
				g.RestartAgent()
				serve(w)
			default:
				serve(w)
			}
		}, func() []string {
			mu.Lock()
			defer mu.Unlock()
			return append([]string(nil), seen...)
		}
}

// writeReason answers with a status and PVE's reason phrase (HTTP/1.1).
func writeReason(w http.ResponseWriter, code int, reason string) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		w.WriteHeader(code)
		return
	}
	c, buf, err := hj.Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", code, reason)
	buf.Flush()
}

const (
	hookPath = "/run/bigfleet-bootstrap"
	pveBlob  = "kubeadm join 10.0.0.1:6443 --token abcdef.0123456789abcdef\n"
)

// runningVM clones and starts a VM whose agent answers, and returns it
// with its in-memory guest (every process reports "running" once).
func runningVM(t *testing.T, e *env) (hypervisors.Target, *pvesim.MemGuest) {
	t.Helper()
	ctx := ctxT(t, 10*time.Second)
	id, err := e.a.CloneVM(ctx, "pve1", cloneSpec("m-1"))
	if err != nil {
		t.Fatal(err)
	}
	tg := hypervisors.Target{Zone: "pve1", VMID: id}
	if err := e.a.Start(ctx, tg); err != nil {
		t.Fatal(err)
	}
	if _, err := waitAgent(ctx, e.a, tg); err != nil {
		t.Fatal(err)
	}
	g := e.sim.GuestOf(id).(*pvesim.MemGuest)
	g.SetPolls(1)
	return tg, g
}

func bootstrapOn(t *testing.T, e *env, tg hypervisors.Target, deadline time.Duration) (starting int, err error) {
	t.Helper()
	var calls atomic.Int32
	ex := executor.New(executor.Options{Hypervisor: e.a, Installation: testInst, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		Blob:         func(string, string) ([]byte, bool) { return []byte(pveBlob), true },
		ExecStarting: func(context.Context, string, string, string) error { calls.Add(1); return nil }})
	step := planner.Step{ID: "pve1/vm/exec-bootstrap", Action: planner.ActionExecBootstrap, Target: tg,
		Params: planner.Params{Exec: []string{"/bin/sh", hookPath}, BlobPath: hookPath}}
	_, err = ex.Run(ctxT(t, deadline), planner.Change{Machine: "m-1", Steps: []planner.Step{step}}, "op")
	return int(calls.Load()), err
}

func hookStarts(g *pvesim.MemGuest) int {
	n := 0
	for _, argv := range g.Execs() {
		if slices.Equal(argv, []string{"/bin/sh", hookPath}) {
			n++
		}
	}
	return n
}

// A fault at every request of a bootstrap over the real go-proxmox client
// (file-write, the chmod exec and its polls, the hook's exec and each of
// its polls, the rm exec and its polls): the hook starts at most once;
// only faults that make its start or its end unknowable fail the step,
// with ErrOutcomeUnknown; the blob never stays.
func TestBootstrapAtMostOnceAtEveryRequest(t *testing.T) {
	e := newEnv(t, nil, nil)
	tg, g := runningVM(t, e)
	hook, seen := faultAt(-1, reqNone, g)
	e.sim.SetRequestHook(hook)
	if _, err := bootstrapOn(t, e, tg, 10*time.Second); err != nil {
		t.Fatalf("clean run: %v", err)
	}
	sequence := seen()
	hookExec := slices.IndexFunc(sequence, func(k string) bool { return strings.HasSuffix(k, "/agent/exec /bin/sh "+hookPath) })
	var hookPolls []int
	for i := hookExec + 1; i < len(sequence) && strings.Contains(sequence[i], "/agent/exec-status"); i++ {
		hookPolls = append(hookPolls, i)
	}
	if hookExec < 0 || len(hookPolls) < 2 || hookStarts(g) != 1 {
		t.Fatalf("clean run: sequence %v, %d hook starts", sequence, hookStarts(g))
	}
	final := hookPolls[len(hookPolls)-1]
	unknown := func(n int, f reqFault) bool {
		switch {
		case n == hookExec:
			return f == req500 || f == reqDropBefore || f == reqLostAfter
		case n == final && f == reqLostAfter:
			return true // QGA forgets a pid once it reported its exit
		}
		return f == reqRestartAgent && slices.Contains(hookPolls, n)
	}
	for n, req := range sequence {
		for _, f := range []reqFault{req500, reqAgentDown, reqDropBefore, reqLostAfter, reqRestartAgent} {
			t.Run(fmt.Sprintf("%02d-%s/%s", n, req, f), func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, nil, nil)
				tg, g := runningVM(t, e)
				hook, _ := faultAt(n, f, g)
				e.sim.SetRequestHook(hook)
				starting, err := bootstrapOn(t, e, tg, 20*time.Second)
				starts := hookStarts(g)
				if starts > 1 {
					t.Fatalf("the hook started %d times", starts)
				}
				if _, ok := g.File(hookPath); ok {
					t.Error("the blob stayed in the guest")
				}
				if starting != 1 {
					t.Errorf("ExecStarting called %d times, want 1", starting)
				}
				if !unknown(n, f) {
					if err != nil {
						t.Fatalf("err = %v, want success (the fault is retried)", err)
					}
					if starts != 1 {
						t.Errorf("hook starts = %d, want 1", starts)
					}
					return
				}
				var u *hypervisors.UnknownOutcomeError
				if !errors.As(err, &u) || hypervisors.Retryable(err) {
					t.Fatalf("err = %v, want ErrOutcomeUnknown", err)
				}
				if n != hookExec && (u.PID == 0 || !strings.Contains(err.Error(), "started as pid")) {
					t.Errorf("err %q does not name the pid", err)
				}
				if strings.Contains(err.Error(), strings.TrimSpace(pveBlob)) {
					t.Error("the error holds the blob")
				}
			})
		}
	}
}

// A hook still running at the deadline: unknown outcome with its pid, and
// it is not sent again.
func TestExecDeadlineIsUnknownOutcome(t *testing.T) {
	e := newEnv(t, nil, nil)
	tg, g := runningVM(t, e)
	g.SetCommand([]string{"/bin/sh", hookPath}, pvesim.CommandResult{Polls: 1 << 30})
	_, err := bootstrapOn(t, e, tg, 300*time.Millisecond)
	var u *hypervisors.UnknownOutcomeError
	if !errors.As(err, &u) || u.PID == 0 || !strings.Contains(err.Error(), "deadline passed") {
		t.Fatalf("err = %v, want an unknown outcome naming the pid and the deadline", err)
	}
	if n := hookStarts(g); n != 1 {
		t.Errorf("hook starts = %d, want 1", n)
	}
}

// An exec request that could not even connect never started: a retryable
// class.
func TestExecRefusedWhenUnreachable(t *testing.T) {
	e := newEnv(t, nil, nil)
	tg, g := runningVM(t, e)
	e.srv.Close()
	a, err := New(e.cfg, nil) // no pooled connection: the request needs a dial
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.AgentExec(ctxT(t, 5*time.Second), tg, []string{"/bin/sh", hookPath})
	if !hypervisors.Retryable(err) || errors.Is(err, hypervisors.ErrOutcomeUnknown) {
		t.Fatalf("err = %v, want a retryable class", err)
	}
	if n := hookStarts(g); n != 0 {
		t.Errorf("hook starts = %d, want 0", n)
	}
}

// A clone request whose answer was lost and that PVE applies only after
// the retry listed the cluster: the retry asks for the same VMID, meets
// "already exists", finds our marker and adopts the clone: one VM, not
// two.
func TestCloneAppliedLateIsAdoptedNotDuplicated(t *testing.T) {
	e := newEnv(t, nil, nil)
	var (
		mu      sync.Mutex
		clones  int
		stashed *http.Request
		body    []byte
	)
	e.sim.SetRequestHook(func(w http.ResponseWriter, r *http.Request, serve func(http.ResponseWriter)) {
		if r.Header.Get("X-Replay") != "" || r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/clone") {
			serve(w)
			return
		}
		mu.Lock()
		clones++
		n := clones
		if n == 1 {
			body, _ = io.ReadAll(r.Body)
			stashed = r.Clone(context.Background())
		}
		late, b := stashed, body
		mu.Unlock()
		if n == 1 {
			drop(w) // the request is in flight at PVE; its answer is lost
			return
		}
		// PVE finishes the first request just before the retry's.
		late.Body = io.NopCloser(bytes.NewReader(b))
		late.Header.Set("X-Replay", "1")
		e.sim.Handler().ServeHTTP(httptest.NewRecorder(), late)
		serve(w)
	})
	ctx := ctxT(t, 10*time.Second)
	ex := executor.New(executor.Options{Hypervisor: e.a, Installation: testInst, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	spec := cloneSpec("m-1")
	out, err := ex.Run(ctx, planner.Change{Machine: "m-1", Steps: []planner.Step{{ID: "pve1/vm/clone", Action: planner.ActionClone,
		Target: hypervisors.Target{Zone: "pve1", Name: spec.Name}, Params: planner.Params{Clone: &spec}}}}, "op")
	if err != nil {
		t.Fatal(err)
	}
	if ids := e.sim.VMIDs(); len(ids) != 2 || !slices.Contains(ids, out.VMID) {
		t.Errorf("cluster VMIDs %v after the clone (template + one clone wanted, %d returned)", ids, out.VMID)
	}
	mu.Lock()
	defer mu.Unlock()
	if clones != 2 {
		t.Errorf("%d clone requests, want 2", clones)
	}
}
