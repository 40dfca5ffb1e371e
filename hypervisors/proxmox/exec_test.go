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

func bootstrapStep(tg hypervisors.Target) planner.Step {
	return planner.Step{ID: "pve1/vm/exec-bootstrap", Action: planner.ActionExecBootstrap, Target: tg,
		Params: planner.Params{Exec: []string{"/bin/sh", hookPath}, BlobPath: hookPath}}
}

func drainStep(tg hypervisors.Target) planner.Step {
	return planner.Step{ID: "pve1/vm/exec-drain", Action: planner.ActionExecDrain, Target: tg,
		Params: planner.Params{Exec: planner.DrainArgv(30)}}
}

// runStep runs one step through the executor against the adapter.
func runStep(t *testing.T, e *env, s planner.Step, deadline time.Duration) (starting int, err error) {
	t.Helper()
	var calls atomic.Int32
	ex := executor.New(executor.Options{Hypervisor: e.a, Installation: testInst, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		Blob:         func(string, string) ([]byte, bool) { return []byte(pveBlob), true },
		ExecStarting: func(context.Context, string, string, string) error { calls.Add(1); return nil }})
	_, err = ex.Run(ctxT(t, deadline), planner.Change{Machine: "m-1", Steps: []planner.Step{s}}, "op")
	return int(calls.Load()), err
}

func bootstrapOn(t *testing.T, e *env, tg hypervisors.Target, deadline time.Duration) (int, error) {
	return runStep(t, e, bootstrapStep(tg), deadline)
}

// starts counts the execs of argv in the guest.
func starts(g *pvesim.MemGuest, argv []string) int {
	n := 0
	for _, a := range g.Execs() {
		if slices.Equal(a, argv) {
			n++
		}
	}
	return n
}

func hookStarts(g *pvesim.MemGuest) int { return starts(g, []string{"/bin/sh", hookPath}) }

// A fault at every request of a guest step over the real go-proxmox
// client (for the bootstrap: file-write, the chmod exec and its polls, the
// hook's exec and each of its polls, the rm exec and its polls; for the
// drain: its exec and polls): the command starts at most once; only faults
// that make its start or its end unknowable fail the step, with
// ErrOutcomeUnknown; the blob never stays.
func TestGuestStepAtMostOnceAtEveryRequest(t *testing.T) {
	for _, kind := range []struct {
		name string
		step func(hypervisors.Target) planner.Step
	}{{"bootstrap", bootstrapStep}, {"drain", drainStep}} {
		e := newEnv(t, nil, nil)
		tg, g := runningVM(t, e)
		argv := kind.step(tg).Params.Exec
		hook, seen := faultAt(-1, reqNone, g)
		e.sim.SetRequestHook(hook)
		if _, err := runStep(t, e, kind.step(tg), 10*time.Second); err != nil {
			t.Fatalf("%s: clean run: %v", kind.name, err)
		}
		sequence := seen()
		cmdExec := slices.IndexFunc(sequence, func(k string) bool { return strings.HasSuffix(k, "/agent/exec "+argv[0]+" "+argv[1]) })
		var polls []int
		for i := cmdExec + 1; i >= 1 && i < len(sequence) && strings.Contains(sequence[i], "/agent/exec-status"); i++ {
			polls = append(polls, i)
		}
		if cmdExec < 0 || len(polls) < 2 || starts(g, argv) != 1 {
			t.Fatalf("%s: clean run: sequence %v, %d starts", kind.name, sequence, starts(g, argv))
		}
		final := polls[len(polls)-1]
		unknown := func(n int, f reqFault) bool {
			switch {
			case n == cmdExec:
				return f == req500 || f == reqDropBefore || f == reqLostAfter
			case n == final && f == reqLostAfter:
				return true // QGA forgets a pid once it reported its exit
			}
			return f == reqRestartAgent && slices.Contains(polls, n)
		}
		for n, req := range sequence {
			for _, f := range []reqFault{req500, reqAgentDown, reqDropBefore, reqLostAfter, reqRestartAgent} {
				t.Run(fmt.Sprintf("%s/%02d-%s/%s", kind.name, n, req, f), func(t *testing.T) {
					t.Parallel()
					e := newEnv(t, nil, nil)
					tg, g := runningVM(t, e)
					hook, _ := faultAt(n, f, g)
					e.sim.SetRequestHook(hook)
					starting, err := runStep(t, e, kind.step(tg), 20*time.Second)
					started := starts(g, argv)
					if started > 1 {
						t.Fatalf("the command started %d times", started)
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
						if started != 1 {
							t.Errorf("command starts = %d, want 1", started)
						}
						return
					}
					var u *hypervisors.UnknownOutcomeError
					if !errors.As(err, &u) || hypervisors.Retryable(err) {
						t.Fatalf("err = %v, want ErrOutcomeUnknown", err)
					}
					if n != cmdExec && (u.PID == 0 || !strings.Contains(err.Error(), "started as pid")) {
						t.Errorf("err %q does not name the pid", err)
					}
					if strings.Contains(err.Error(), strings.TrimSpace(pveBlob)) {
						t.Error("the error holds the blob")
					}
				})
			}
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
