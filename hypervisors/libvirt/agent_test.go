package libvirt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/guest"
	"github.com/bigfleet-vm/provider/hypervisors/guest/guestsim"
	"github.com/bigfleet-vm/provider/hypervisors/guest/guesttest"
	"github.com/bigfleet-vm/provider/retry"
)

var (
	errAgentGone    = golibvirt.Error{Code: uint32(golibvirt.ErrAgentUnresponsive), Message: "Guest agent is not responding: QEMU guest agent is not connected"}
	errAgentTimeout = golibvirt.Error{Code: uint32(golibvirt.ErrAgentCommandTimeout), Message: "Guest agent not available for now"}
)

// wire is libvirtd's agent passthrough to a simulated qemu-ga, with one
// fault at the n-th command.
type wire struct {
	q       *guestsim.QGA
	n       int
	fault   guesttest.Fault
	onFault func()
	hang    chan struct{}

	mu   sync.Mutex
	seen []guesttest.Call
	held []string // commands a Late fault holds
}

// The faults of this wire: what libvirtd answers (or does not).
var wireFaults = []guesttest.Fault{
	{Name: "not-connected", Class: guesttest.Refused},            // refused before sending: no agent
	{Name: "lost-before", Class: guesttest.LostBefore},           // a timeout; the agent never got it
	{Name: "lost-after", Class: guesttest.LostAfter},             // the agent did it; the reply timed out
	{Name: "reboot", Class: guesttest.RestartAgent},              // the agent restarted just before
	{Name: "hang-after", Class: guesttest.LostAfter, Slow: true}, // the agent did it; the call never answers
}

func (w *wire) send(_ *golibvirt.Libvirt, _ golibvirt.Domain, cmd string, _ int32) (golibvirt.OptString, error) {
	var req struct {
		Execute   string            `json:"execute"`
		Arguments guestsim.ExecArgs `json:"arguments"`
	}
	_ = json.Unmarshal([]byte(cmd), &req)
	c := guesttest.Call{Kind: "other", Name: req.Execute}
	switch req.Execute {
	case "guest-exec":
		c.Kind, c.Argv = "exec", append([]string{req.Arguments.Path}, req.Arguments.Arg...)
	case "guest-exec-status":
		c.Kind = "status"
	case "guest-file-write":
		c.Kind = "write"
	}
	w.mu.Lock()
	i := len(w.seen)
	w.seen = append(w.seen, c)
	w.mu.Unlock()
	if i != w.n {
		return golibvirt.OptString{w.q.Command(cmd)}, nil
	}
	if w.onFault != nil {
		w.onFault()
	}
	switch w.fault.Class {
	case guesttest.Refused:
		return nil, errAgentGone
	case guesttest.LostBefore:
		return nil, errAgentTimeout
	case guesttest.Late:
		w.mu.Lock()
		w.held = append(w.held, cmd)
		w.mu.Unlock()
		return nil, errAgentTimeout
	case guesttest.RestartAgent:
		w.q.Restart()
	}
	res := w.q.Command(cmd)
	switch {
	case w.fault.Class == guesttest.LostAfter && w.fault.Slow:
		<-w.hang
		return nil, errors.New("connection closed")
	case w.fault.Class == guesttest.LostAfter:
		return nil, errAgentTimeout
	}
	return golibvirt.OptString{res}, nil
}

func (w *wire) calls() []guesttest.Call {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]guesttest.Call(nil), w.seen...)
}

// replay delivers the held commands to the agent (their answers go
// nowhere).
func (w *wire) replay() {
	w.mu.Lock()
	held := w.held
	w.held = nil
	w.mu.Unlock()
	for _, cmd := range held {
		w.q.Command(cmd)
	}
}

// testQGA is one domain's transport over a real zoneConn.call (with a
// placeholder client the simulated send never touches).
func testQGA(t *testing.T, send qgaSend) *qga {
	t.Helper()
	cfg := Config{CallTimeout: 20 * time.Millisecond}
	cfg.defaults()
	zc := newZoneConn("z", nil, &cfg, nil, new(atomic.Int64), new(atomic.Int64))
	zc.lv = &golibvirt.Libvirt{}
	zc.gen = 1
	return &qga{cfg: &cfg, zc: zc, dom: golibvirt.Domain{Name: "vm"}, send: send}
}

var fastPoll = retry.Policy{Initial: time.Millisecond, Max: 2 * time.Millisecond}

var qgaTransport = guesttest.Transport{Faults: wireFaults,
	New: func(t *testing.T, g *guestsim.Guest, n int, f guesttest.Fault, onFault func()) guesttest.Env {
		w := &wire{q: guestsim.NewQGA(g), n: n, fault: f, onFault: onFault, hang: make(chan struct{})}
		t.Cleanup(func() { close(w.hang) })
		return guesttest.Env{Agent: &guest.Agent{T: testQGA(t, w.send), Poll: fastPoll}, Seen: w.calls, Replay: w.replay}
	}}

// The protocol's suite over libvirt's QGA passthrough.
func TestGuestStepAtMostOnceAtEveryCall(t *testing.T) {
	guesttest.TestAtMostOnceAtEveryCall(t, qgaTransport)
}
func TestGuestStepLeaderKilledAtEveryCall(t *testing.T) {
	guesttest.TestLeaderKilledAtEveryCall(t, qgaTransport)
}
func TestExecDeadlineIsUnknownOutcome(t *testing.T) { guesttest.TestDeadline(t, qgaTransport) }
func TestAgentWriteFile(t *testing.T)               { guesttest.TestWriteFile(t, qgaTransport) }

// A command to a zone whose connection is down never left this process:
// it is a retryable class, so the caller may send it again.
func TestExecOnDisconnectedZoneIsNotStarted(t *testing.T) {
	g := guesttest.NewGuest()
	w := &wire{q: guestsim.NewQGA(g), n: -1}
	q := testQGA(t, w.send)
	q.zc.lv = nil
	_, err := (&guest.Agent{T: q, Poll: fastPoll}).Exec(context.Background(), []string{guesttest.Hook, "c-1"})
	if !hypervisors.Retryable(err) || errors.Is(err, hypervisors.ErrOutcomeUnknown) {
		t.Fatalf("err = %v, want a retryable class", err)
	}
	if calls := w.calls(); len(calls) != 0 {
		t.Errorf("commands reached the agent: %v", calls)
	}
}

// qemu-ga's answer for an unknown pid is guest.ErrPIDGone; its other
// refusals are not.
func TestStatusPIDGone(t *testing.T) {
	g := guesttest.NewGuest()
	w := &wire{q: guestsim.NewQGA(g), n: -1}
	_, err := testQGA(t, w.send).Status(context.Background(), 4242)
	if !errors.Is(err, guest.ErrPIDGone) {
		t.Errorf("unknown pid: err = %v, want ErrPIDGone", err)
	}
}

func TestStartRefused(t *testing.T) {
	le := func(code golibvirt.ErrorNumber, msg string) error {
		return classify("op", golibvirt.Error{Code: uint32(code), Message: msg})
	}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"agent answered an error", fmt.Errorf("x: %w", &qgaError{Class: "GenericError", Desc: "Failed to execute child process"}), true},
		{"no agent connected", le(golibvirt.ErrAgentUnresponsive, "Guest agent is not responding: QEMU guest agent is not connected"), true},
		{"domain not running", le(golibvirt.ErrOperationInvalid, "Requested operation is not valid: domain is not running"), true},
		{"agent vanished mid-command", le(golibvirt.ErrAgentUnresponsive, "Guest agent is not responding: Guest agent disappeared while executing command"), false},
		{"agent timeout", le(golibvirt.ErrAgentCommandTimeout, "Guest agent not available for now"), false},
		{"rpc timeout", fmt.Errorf("op: %w: no answer within 1s", hypervisors.ErrTransient), false},
	}
	for _, tc := range tests {
		if got := startRefused(tc.err); got != tc.want {
			t.Errorf("%s: startRefused = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Output that is not base64 is replaced by a note; the exit status is
// kept (the outcome is never lost over its output).
func TestUndecodableOutputKeepsExitCode(t *testing.T) {
	q := testQGA(t, func(_ *golibvirt.Libvirt, _ golibvirt.Domain, _ string, _ int32) (golibvirt.OptString, error) {
		return golibvirt.OptString{`{"return":{"exited":true,"exitcode":3,"out-data":"%%%"}}`}, nil
	})
	st, err := q.Status(context.Background(), 7)
	if err != nil || !st.Exited || st.ExitCode != 3 || !strings.Contains(string(st.Stdout), "not base64") {
		t.Fatalf("status = %+v, %v", st, err)
	}
}

// The agent's error text is bounded in errors.
func TestQGAErrorIsBounded(t *testing.T) {
	e := &qgaError{Desc: strings.Repeat("x", 10000)}
	if n := len(e.Error()); n > maxAgentDesc+32 {
		t.Errorf("error is %d bytes", n)
	}
}
