package contract

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// planSummary is the part of /debug/plan the restart tests read.
type planSummary struct {
	Summary map[string]int `json:"summary"`
	Drift   []struct {
		Kind    string `json:"kind"`
		Machine string `json:"machine"`
	} `json:"drift"`
}

func (s *server) plan() planSummary {
	s.T().Helper()
	var p planSummary
	_, body := s.HTTPGet("/debug/plan")
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		s.T().Fatalf("decode /debug/plan: %v", err)
	}
	return p
}

// waitConverged polls /debug/plan until it has no steps and no drift: no
// leaked, orphaned or missing VM (nothing lost or duplicated).
func waitConverged(t testing.TB, s *server) {
	t.Helper()
	var p planSummary
	for end := time.Now().Add(pollDeadline); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		p = s.plan()
		if p.Summary["steps"] == 0 && len(p.Drift) == 0 {
			return
		}
	}
	t.Errorf("world never converged with the document: summary %v drift %v", p.Summary, p.Drift)
}

func testRestartKill9(t *testing.T, h Harness) {
	state := filepath.Join(t.TempDir(), "state")
	s := h.start(t, "--seed-count", "16", "--state", state, "--fake-latency", "200ms")
	sp := speculative(t, s.c, 8)
	bound, idle, inCreate, inConfigure, inDrain, inDelete := sp[0], sp[1], sp[2], sp[3], sp[4], sp[5]
	ops := opSet{}
	md := oddMetadata()

	// Settled machines with history, fence marks and bindings.
	opCreateBound := providertest.Must(t, "create")(create(s.c, t, bound, tok{Shard: "s1", Epoch: 1, Seq: 1})).OperationId
	ops.fresh(t, "create bound", opCreateBound)
	opCreateIdle := providertest.Must(t, "create")(create(s.c, t, idle, tok{Shard: "s2", Epoch: 7, Seq: 7})).OperationId
	ops.fresh(t, "create idle", opCreateIdle)
	for _, id := range []string{inConfigure, inDrain, inDelete} {
		ops.fresh(t, "create "+id, providertest.Must(t, "create")(create(s.c, t, id, tok{})).OperationId)
	}
	for _, id := range []string{bound, idle, inConfigure, inDrain, inDelete} {
		providertest.WaitState(t, s.c, id, providertest.StIdle, pollDeadline)
	}
	opConfigureBound := providertest.Must(t, "configure")(configure(s.c, t, bound, "c1", md, tok{Shard: "s1", Epoch: 1, Seq: 5})).OperationId
	ops.fresh(t, "configure bound", opConfigureBound)
	ops.fresh(t, "configure drain", providertest.Must(t, "configure")(configure(s.c, t, inDrain, "c9", nil, tok{})).OperationId)
	providertest.WaitState(t, s.c, bound, providertest.StConfigured, pollDeadline)
	providertest.WaitState(t, s.c, inDrain, providertest.StConfigured, pollDeadline)
	boundHost := providertest.Get(t, s.c, bound).Host
	before := list(t, s.c, &pb.ListFilter{})

	// Transitions in flight at the kill.
	opInCreate := providertest.Must(t, "create")(create(s.c, t, inCreate, tok{})).OperationId
	ops.fresh(t, "in-flight create", opInCreate)
	ops.fresh(t, "in-flight configure", providertest.Must(t, "configure")(configure(s.c, t, inConfigure, "c2", map[string]string{"x": "y"}, tok{})).OperationId)
	ops.fresh(t, "in-flight drain", providertest.Must(t, "drain")(drain(s.c, t, inDrain, tok{})).OperationId)
	ops.fresh(t, "in-flight delete", providertest.Must(t, "delete")(del(s.c, t, inDelete, tok{})).OperationId)
	for _, id := range []string{inCreate, inConfigure, inDrain, inDelete} {
		if m := providertest.Get(t, s.c, id); stable(m.State) {
			t.Logf("note: %s already settled (%v) before the kill", id, m.State)
		}
	}
	s.Restart()

	// Inventory: nothing lost or duplicated.
	after := providertest.ListAll(t, s.c)
	if diff := cmp.Diff(providertest.IDs(before.Machines), providertest.IDs(after)); diff != "" {
		t.Errorf("inventory changed across kill -9 (-before +after):\n%s", diff)
	}
	// Bindings and metadata.
	m := providertest.Get(t, s.c, bound)
	if m.State != providertest.StConfigured || m.Cluster != "c1" {
		t.Errorf("bound machine after restart: %v cluster %q", m.State, m.Cluster)
	}
	if diff := protoDiff(md, m.ShardMetadata); diff != "" {
		t.Errorf("shard_metadata after restart (-want +got):\n%s", diff)
	}
	if diff := protoDiff(boundHost, m.Host); diff != "" {
		t.Errorf("host after restart (-want +got):\n%s", diff)
	}
	// Interrupted transitions end stable: re-driven, or FAILED for
	// Configure (the blob is never on disk).
	providertest.WaitState(t, s.c, inCreate, providertest.StIdle, pollDeadline)
	providertest.WaitState(t, s.c, inDelete, providertest.StSpeculative, pollDeadline)
	// A drain whose command had already started in the guest is never
	// run again: it ends FAILED (its outcome is unknown) instead.
	if dm := waitSettled(t, s.c, inDrain); dm.State != providertest.StIdle && !(dm.State == providertest.StFailed && strings.Contains(dm.LastError, "never run twice")) {
		t.Errorf("interrupted Drain ended %v last_error %q", dm.State, dm.LastError)
	}
	cm := waitSettled(t, s.c, inConfigure)
	switch {
	case cm.State == providertest.StFailed && cm.LastError != "":
	case cm.State == providertest.StConfigured:
		t.Logf("interrupted Configure had already finished before the kill")
	default:
		t.Errorf("interrupted Configure ended %v last_error %q, want FAILED with a last_error", cm.State, cm.LastError)
	}
	// Idempotency map.
	for _, c := range []struct {
		name string
		got  func() (*pb.TransitionAck, error)
		want string
	}{
		{"create on IDLE (unfenced retry)", func() (*pb.TransitionAck, error) { return create(s.c, t, idle, tok{}) }, opCreateIdle},
		{"create re-driven after restart", func() (*pb.TransitionAck, error) { return create(s.c, t, inCreate, tok{}) }, opInCreate},
		{"configure on CONFIGURED", func() (*pb.TransitionAck, error) {
			return configure(s.c, t, bound, "c1", md, tok{Shard: "s1", Epoch: 1, Seq: 6})
		}, opConfigureBound},
	} {
		a, err := c.got()
		if err != nil || a.OperationId != c.want {
			t.Errorf("%s after restart: %v %v, want the original op %q", c.name, a.GetOperationId(), err, c.want)
		}
	}
	// Fence marks.
	for _, c := range []struct {
		name string
		err  error
		want codes.Code
	}{
		{"s1 stale on bound", func() error { _, err := drain(s.c, t, bound, tok{Shard: "s1", Epoch: 1, Seq: 6}); return err }(), codes.FailedPrecondition},
		{"s2 stale on idle", func() error { _, err := create(s.c, t, idle, tok{Shard: "s2", Epoch: 7, Seq: 7}); return err }(), codes.FailedPrecondition},
		{"brand-new shard first token", func() error { _, err := create(s.c, t, idle, tok{Shard: "s-new", Epoch: 0, Seq: 0}); return err }(), codes.OK},
	} {
		if code(c.err) != c.want {
			t.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
	// Revision space: the pre-kill cursor still parses, so the delta is
	// not a full list and holds the machines that moved.
	d := providertest.IDs(list(t, s.c, &pb.ListFilter{SinceRevision: before.Revision}).Machines)
	if len(d) >= len(after) {
		t.Errorf("pre-restart cursor treated as garbage: delta of %d machines (of %d)", len(d), len(after))
	}
	for _, id := range []string{inCreate, inConfigure, inDrain, inDelete} {
		if !slices.Contains(d, id) {
			t.Errorf("delta since the pre-kill cursor lacks %s: %v", id, d)
		}
	}
	// Fresh op ids never repeat pre-restart ones, across a second kill.
	ops.fresh(t, "post-restart create", providertest.Must(t, "create")(create(s.c, t, sp[6], tok{})).OperationId)
	s.Restart()
	ops.fresh(t, "post-2nd-restart create", providertest.Must(t, "create")(create(s.c, t, sp[7], tok{})).OperationId)
	ops.fresh(t, "post-2nd-restart delete", providertest.Must(t, "delete")(del(s.c, t, inCreate, tok{})).OperationId)
	providertest.WaitState(t, s.c, sp[6], providertest.StIdle, pollDeadline)
	providertest.WaitState(t, s.c, sp[7], providertest.StIdle, pollDeadline)
	providertest.WaitState(t, s.c, inCreate, providertest.StSpeculative, pollDeadline)
	waitConverged(t, s)
}

func testSIGTERMFlushes(t *testing.T, h Harness) {
	state := filepath.Join(t.TempDir(), "state")
	s := h.start(t, "--seed-count", "8", "--state", state)
	sp := speculative(t, s.c, 3)
	toConfigured(t, s.c, sp[0], "c1", map[string]string{"k": "v"})
	toIdle(t, s.c, sp[1])
	opIdle := providertest.Must(t, "create")(create(s.c, t, sp[1], tok{Shard: "s", Epoch: 3, Seq: 3})).OperationId
	before := providertest.ListAll(t, s.c)
	if code := s.Terminate(); code != 0 {
		t.Fatalf("SIGTERM exit code %d, want 0\nstderr:\n%s", code, s.Output())
	}
	s.Launch()
	if diff := protoDiff(before, providertest.ListAll(t, s.c)); diff != "" {
		// Revision order is part of List; compare as sets by id.
		t.Errorf("state after graceful restart (-before +after):\n%s", diff)
	}
	if a, err := create(s.c, t, sp[1], tok{Shard: "s", Epoch: 3, Seq: 4}); err != nil || a.OperationId != opIdle {
		t.Errorf("idempotent create after graceful restart: %v %v, want %q", a.GetOperationId(), err, opIdle)
	}
	if _, err := create(s.c, t, sp[1], tok{Shard: "s", Epoch: 3, Seq: 4}); code(err) != codes.FailedPrecondition {
		t.Errorf("fence mark lost across graceful restart: %v", err)
	}
	waitConverged(t, s)
}

// testKill9RightAfterSettle kills the provider the moment a Create has
// settled. The machine was reported IDLE and the document is durable, so
// after the restart it must still be IDLE on the same host.
func testKill9RightAfterSettle(t *testing.T, h Harness) {
	state := filepath.Join(t.TempDir(), "state")
	s := h.start(t, "--seed-count", "4", "--state", state)
	id := speculative(t, s.c, 1)[0]
	toIdle(t, s.c, id)
	host := providertest.Get(t, s.c, id).Host
	s.Restart()
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		m := providertest.Get(t, s.c, id)
		if m.State != providertest.StIdle || protoDiff(host, m.Host) != "" {
			t.Fatalf("IDLE machine after kill -9: %v host %v last_error %q, want IDLE on %v", m.State, m.Host, m.LastError, host)
		}
	}
}

// A guest command runs at most once per operation, also across kill -9:
// a Drain killed right after the executor logged that its command is
// starting (its wrapper sent or about to be) is completed by the restarted
// provider from the guest's record, or run by it if it never started: the
// machine ends IDLE and the drain ran exactly once.
func testGuestCommandNeverRunsTwiceAcrossKill9(t *testing.T, h Harness) {
	state := filepath.Join(t.TempDir(), "state")
	s := h.start(t, "--seed-count", "4", "--state", state, "--fake-latency", "1s", "--log-level", "info", "--fake-admin")
	id := speculative(t, s.c, 1)[0]
	toConfigured(t, s.c, id, "c1", nil)
	op := providertest.Must(t, "drain")(drain(s.c, t, id, tok{})).OperationId
	started := false
	for end := time.Now().Add(pollDeadline); time.Now().Before(end) && !started; time.Sleep(5 * time.Millisecond) {
		started = strings.Contains(s.Output(), "guest command starting") && strings.Contains(s.Output(), "exec-drain")
	}
	if !started {
		t.Fatal("the drain command never started")
	}
	s.Restart()
	m := waitSettled(t, s.c, id)
	if m.State != providertest.StIdle {
		t.Errorf("drain interrupted after its command started ended %v %q, want IDLE", m.State, m.LastError)
	}
	if n := s.guest(id).drainRuns(op); n != 1 {
		t.Errorf("the drain ran %d times for %s, want exactly once", n, op)
	}
}

// guestView is what GET /admin/guest shows of a machine's simulated guest.
type guestView struct {
	Bootstraps []struct {
		Key     string `json:"key"`
		Cluster string `json:"cluster"`
	} `json:"bootstraps"`
	Drains    int      `json:"drains"`
	DrainKeys []string `json:"drain_keys"`
}

func (s *server) guest(id string) guestView {
	s.T().Helper()
	code, body := s.HTTPGet("/admin/guest?machine=" + id)
	if code != 200 {
		s.T().Fatalf("GET /admin/guest %s: %d %s", id, code, body)
	}
	var g guestView
	if err := json.Unmarshal([]byte(body), &g); err != nil {
		s.T().Fatalf("decode /admin/guest: %v", err)
	}
	return g
}

// hookRuns counts the runs of a Configure's hook in the guest.
func (g guestView) hookRuns(op string) int {
	n := 0
	for _, b := range g.Bootstraps {
		if strings.HasPrefix(b.Key, op+"-bootstrap") {
			n++
		}
	}
	return n
}

func (g guestView) drainRuns(op string) int {
	n := 0
	for _, k := range g.DrainKeys {
		if strings.HasPrefix(k, op+"-drain") {
			n++
		}
	}
	return n
}

// A kill -9 while the bootstrap hook runs in the guest (its run is
// durable in the simulated guest when the kill lands) and while the drain
// runs: after the restart the Configure ends CONFIGURED and the Drain
// IDLE, each command having run exactly once in the guest. The restarted
// provider does not have the blob; it follows the guest's record of the
// hook (issue 17 item 5).
func testKill9MidGuestCommandRunsItOnce(t *testing.T, h Harness) {
	state := filepath.Join(t.TempDir(), "state")
	s := h.start(t, "--seed-count", "4", "--state", state, "--fake-latency", "300ms", "--fake-admin")
	id := speculative(t, s.c, 1)[0]
	providertest.Must(t, "create")(create(s.c, t, id, tok{}))
	providertest.WaitState(t, s.c, id, providertest.StIdle, pollDeadline)

	// Kill -9 while the hook runs.
	op := providertest.Must(t, "configure")(configure(s.c, t, id, "c-kill", nil, tok{})).OperationId
	waitGuest(t, s, func(g guestView) bool { return g.hookRuns(op) > 0 }, "the hook to start")
	if m := providertest.Get(t, s.c, id); m.State != providertest.StConfiguring {
		t.Fatalf("the hook has started but the machine is already %v: the kill would not land mid-Configure", m.State)
	}
	s.Restart()
	m := waitSettled(t, s.c, id)
	if m.State != providertest.StConfigured || m.Cluster != "c-kill" {
		t.Fatalf("Configure interrupted mid-hook ended %v (cluster %q, last_error %q); want CONFIGURED", m.State, m.Cluster, m.LastError)
	}
	if n := s.guest(id).hookRuns(op); n != 1 {
		t.Errorf("the hook ran %d times for %s, want exactly once", n, op)
	}

	// The same for a Drain.
	op = providertest.Must(t, "drain")(drain(s.c, t, id, tok{})).OperationId
	waitGuest(t, s, func(g guestView) bool { return g.drainRuns(op) > 0 }, "the drain to start")
	s.Restart()
	if m := waitSettled(t, s.c, id); m.State != providertest.StIdle {
		t.Fatalf("Drain interrupted mid-drain ended %v (last_error %q); want IDLE", m.State, m.LastError)
	}
	if n := s.guest(id).drainRuns(op); n != 1 {
		t.Errorf("the drain ran %d times for %s, want exactly once", n, op)
	}
}

// waitGuest polls the machine's simulated guest until ok.
func waitGuest(t *testing.T, s *server, ok func(guestView) bool, what string) {
	t.Helper()
	ids := providertest.ListAll(t, s.c, providertest.StConfiguring, providertest.StDraining)
	if len(ids) != 1 {
		t.Fatalf("want one machine in a guest transition, have %d", len(ids))
	}
	for end := time.Now().Add(pollDeadline); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if ok(s.guest(ids[0].Id)) {
			return
		}
	}
	t.Fatalf("waited %v for %s", pollDeadline, what)
}
