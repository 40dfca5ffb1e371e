package contract

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/internal/planschema"
	"github.com/bigfleet-vm/provider/internal/providertest"
	"github.com/bigfleet-vm/provider/jsonhistory"
)

// historyOf runs `provider history ID --json` with args (offline --state
// flags or --server) and decodes what it prints.
func historyOf(t *testing.T, h Harness, id string, args ...string) *jsonhistory.History {
	t.Helper()
	out, code := h.runRaw(t, append([]string{"history", id, "--json"}, args...)...)
	if code != 0 {
		t.Fatalf("provider history %s %v: exit %d\n%s", id, args, code, out)
	}
	if err := planschema.ValidateHistory([]byte(out)); err != nil {
		t.Fatalf("provider history %s: not valid against docs/history.schema.json: %v\n%s", id, err, out)
	}
	hist, err := jsonhistory.Decode([]byte(out))
	if err != nil {
		t.Fatalf("provider history %s: %v\n%s", id, err, out)
	}
	return hist
}

// transitions lists a machine's transitions as "FROM>TO cause", and
// counts its events by kind and action.
func transitions(h *jsonhistory.History) (trans []string, by map[string]int) {
	by = map[string]int{}
	for _, m := range h.Machines {
		for _, e := range m.Events {
			if e.Kind == "transition" {
				trans = append(trans, e.From+">"+e.To+" "+e.Cause)
			}
			by[e.Kind+" "+e.Action+" "+e.Outcome]++
		}
	}
	return trans, by
}

// A machine walked through Create, Configure, a kill -9, a drift repair,
// Drain and Delete, and one whose Drain fails, show every transition once
// and in order, the steps, the guest commands with their exit status and
// the drift, the same offline from --state and live from the metrics
// listener.
func testHistoryOfAMachineAcrossKill9(t *testing.T, h Harness) {
	state := filepath.Join(t.TempDir(), "state")
	flags := append(slices.Clone(h.Args), "--seed-count", "4", "--state", state)
	s := h.start(t, "--seed-count", "4", "--state", state, "--fake-admin", "--fake-faults", "--reconcile-interval", "1s")
	ids := speculative(t, s.c, 2)
	id, bad := ids[0], ids[1]
	toConfigured(t, s.c, id, "c1", nil)
	s.Restart() // kill -9
	s.Admin("stop?machine=" + id)
	// The repair's drift and steps ride along with the next commit
	// (the full pass flushes them): wait until they are readable.
	live := []string{"--server", s.MetricsURL()}
	for end := time.Now().Add(pollDeadline); ; time.Sleep(50 * time.Millisecond) {
		if _, by := transitions(historyOf(t, h, id, live...)); by["step start ok"] > 1 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the drift repair never reached the history:\n%s", s.Output())
		}
	}
	providertest.Must(t, "Drain")(drain(s.c, t, id, tok{}))
	providertest.WaitState(t, s.c, id, providertest.StIdle, pollDeadline)
	providertest.Must(t, "Delete")(del(s.c, t, id, tok{}))
	providertest.WaitState(t, s.c, id, providertest.StSpeculative, pollDeadline)

	toConfigured(t, s.c, bad, "fault-drain-error", nil)
	providertest.Must(t, "Drain")(drain(s.c, t, bad, tok{}))
	providertest.WaitState(t, s.c, bad, providertest.StFailed, pollDeadline)

	want := []string{
		"SPECULATIVE>CREATING rpc", "CREATING>IDLE completed",
		"IDLE>CONFIGURING rpc", "CONFIGURING>CONFIGURED completed",
		"CONFIGURED>DRAINING rpc", "DRAINING>IDLE completed",
		"IDLE>DELETING rpc", "DELETING>SPECULATIVE completed",
	}
	offline := historyOf(t, h, id, flags...)
	trans, by := transitions(offline)
	if diff := cmp.Diff(want, trans); diff != "" {
		t.Errorf("transitions offline (-want +got):\n%s", diff)
	}
	for _, k := range []string{"drift repair: start ", "guest exec-bootstrap ok", "guest exec-drain ok"} {
		if by[k] != 1 {
			t.Errorf("%q: %d events, want 1 (%v)", k, by[k], by)
		}
	}
	if by["step start ok"] < 2 { // the Create's and the repair's
		t.Errorf("start steps: %d, want the Create's and the repair's (%v)", by["step start ok"], by)
	}
	if diff := cmp.Diff(offline.Machines, historyOf(t, h, id, live...).Machines); diff != "" {
		t.Errorf("live and offline histories differ (-offline +live):\n%s", diff)
	}

	hist := historyOf(t, h, bad, live...)
	trans, by = transitions(hist)
	if n := len(trans); n == 0 || trans[n-1] != "DRAINING>FAILED error" {
		t.Errorf("the failed drain's transitions: %v", trans)
	}
	if by["guest exec-drain exited"] != 1 || by["step exec-drain error"] != 1 {
		t.Errorf("the failed drain's guest command and step: %v", by)
	}
	// The text form reads as a timeline with where the time went.
	out, code := h.runRaw(t, append([]string{"history", bad}, flags...)...)
	if code != 0 || !strings.Contains(out, "CONFIGURED → DRAINING") || !strings.Contains(out, "exited 1") ||
		!strings.Contains(out, "simulated drain failure") || !strings.Contains(out, "took") {
		t.Errorf("text history:\n%s", out)
	}
	// The fleet timeline of FAILED machines names it.
	out, code = h.runRaw(t, "history", "--since", "1h", "--machine-state", "FAILED", "--server", s.MetricsURL())
	if code != 0 || !strings.Contains(out, bad) || strings.Contains(out, id) {
		t.Errorf("fleet timeline of FAILED machines:\n%s", out)
	}
}
