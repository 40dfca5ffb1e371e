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
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/executor"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/guest"
	"github.com/bigfleet-vm/provider/hypervisors/guest/guestsim"
	"github.com/bigfleet-vm/provider/hypervisors/guest/guesttest"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvesim"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvespec"
	"github.com/bigfleet-vm/provider/planner"
)

// The faults of PVE's wire: what the simulated PVE does to one request.
var reqFaults = []guesttest.Fault{
	{Name: "500", Class: guesttest.LostBefore},             // a 500 before PVE did anything
	{Name: "agent-down", Class: guesttest.Refused},         // "QEMU guest agent is not running", before asking the agent
	{Name: "drop-before", Class: guesttest.LostBefore},     // the connection drops before PVE did anything
	{Name: "lost-after", Class: guesttest.LostAfter},       // PVE did it, then the connection dropped
	{Name: "restart-agent", Class: guesttest.RestartAgent}, // the guest agent restarted just before
}

func drop(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if c, _, err := hj.Hijack(); err == nil {
			c.Close()
		}
	}
}

// faultAt returns a RequestHook that applies f to the n-th agent request
// (from 0) and records every agent request, and a replay of the requests
// a Late fault held.
func faultAt(t *testing.T, sim *pvesim.Server, n int, f guesttest.Fault, onFault func(), g *guestsim.Guest) (pvesim.RequestHook, func() []guesttest.Call, func()) {
	var mu sync.Mutex
	var seen []guesttest.Call
	type heldReq struct {
		r    *http.Request
		body []byte
	}
	var held []heldReq
	return func(w http.ResponseWriter, r *http.Request, serve func(http.ResponseWriter)) {
			path := strings.TrimPrefix(r.URL.Path, "/api2/json")
			i := strings.Index(path, "/agent/")
			if i < 0 || r.Header.Get("X-Replay") != "" {
				serve(w)
				return
			}
			c := guesttest.Call{Kind: "other", Name: r.Method + " " + path[i:]}
			b, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(b))
			switch path[i:] {
			case "/agent/exec":
				var req struct{ Command []string }
				_ = json.Unmarshal(b, &req)
				c.Kind, c.Argv = "exec", req.Command
			case "/agent/exec-status":
				c.Kind = "status"
			case "/agent/file-write":
				c.Kind = "write"
			}
			mu.Lock()
			k := len(seen)
			seen = append(seen, c)
			mu.Unlock()
			if k != n {
				serve(w)
				return
			}
			if onFault != nil {
				onFault()
			}
			switch f.Class {
			case guesttest.LostBefore:
				if f.Name == "500" {
					w.WriteHeader(500)
				} else {
					drop(w)
				}
			case guesttest.Refused:
				writeReason(w, 500, "QEMU guest agent is not running")
			case guesttest.LostAfter:
				serve(httptest.NewRecorder())
				drop(w)
			case guesttest.Late:
				late := r.Clone(context.Background())
				late.Header.Set("X-Replay", "1")
				mu.Lock()
				held = append(held, heldReq{late, b})
				mu.Unlock()
				drop(w)
			case guesttest.RestartAgent:
				g.RestartAgent()
				serve(w)
			default:
				serve(w)
			}
		}, func() []guesttest.Call {
			mu.Lock()
			defer mu.Unlock()
			return append([]guesttest.Call(nil), seen...)
		}, func() {
			mu.Lock()
			h := held
			held = nil
			mu.Unlock()
			for _, req := range h {
				req.r.Body = io.NopCloser(bytes.NewReader(req.body))
				sim.Handler().ServeHTTP(httptest.NewRecorder(), req.r)
			}
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

// transport is PVE's agent endpoints, over the simulator with the real
// go-proxmox client, as the protocol's suite drives them: a running VM
// whose guest is the suite's.
var transport = guesttest.Transport{Faults: reqFaults,
	New: func(t *testing.T, g *guestsim.Guest, n int, f guesttest.Fault, onFault func()) guesttest.Env {
		e := newEnv(t, nil, nil)
		e.sim.SetGuestFactory(func(int) pvesim.Guest { return pvesim.AgentOf(g) })
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
		hook, seen, replay := faultAt(t, e.sim, n, f, onFault, g)
		e.sim.SetRequestHook(hook)
		ga, err := e.a.agent(tg)
		if err != nil {
			t.Fatal(err)
		}
		return guesttest.Env{Agent: ga, Seen: seen, Replay: replay}
	}}

// The protocol's suite over PVE's agent endpoints.
func TestGuestStepAtMostOnceAtEveryRequest(t *testing.T) {
	guesttest.TestAtMostOnceAtEveryCall(t, transport)
}
func TestGuestStepLeaderKilledAtEveryRequest(t *testing.T) {
	guesttest.TestLeaderKilledAtEveryCall(t, transport)
}
func TestExecDeadlineIsUnknownOutcome(t *testing.T) { guesttest.TestDeadline(t, transport) }
func TestAgentWriteFileSuite(t *testing.T)          { guesttest.TestWriteFile(t, transport) }

const hookPath = "/run/bigfleet-bootstrap"

// runningVM clones and starts a VM whose agent answers, and returns it
// with its in-memory guest.
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
	return tg, e.sim.GuestOf(id).(*pvesim.MemGuest)
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
	if n := len(g.Execs()); n != 0 {
		t.Errorf("execs = %d, want 0", n)
	}
}

// QGA's answer for an unknown pid, through PVE, is guest.ErrPIDGone.
func TestStatusPIDGone(t *testing.T) {
	e := newEnv(t, nil, nil)
	tg, _ := runningVM(t, e)
	ga, err := e.a.agent(tg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ga.T.Status(ctxT(t, 5*time.Second), 999999); !errors.Is(err, guest.ErrPIDGone) {
		t.Errorf("err = %v, want ErrPIDGone", err)
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
	out, err := ex.Run(ctx, planner.Change{Machine: "m-1", Steps: []planner.Step{{ID: "pve1/vm/clone", Action: planner.Action(pvespec.ActionClone),
		Target: hypervisors.Target{Zone: "pve1", Name: spec.Name}, Params: planner.Params{Plugin: &spec}}}}, "op")
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
