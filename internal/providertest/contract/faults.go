package contract

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// waitFailed polls until FAILED, failing if the machine ever shows
// CONFIGURED first (a hook that did not succeed must never look bound).
func waitFailed(t *testing.T, c pb.CapacityProviderClient, id string, never pb.MachineState) *pb.Machine {
	t.Helper()
	for end := time.Now().Add(pollDeadline); time.Now().Before(end); sleepPoll() {
		m := providertest.Get(t, c, id)
		switch m.State {
		case providertest.StFailed:
			if m.LastError == "" {
				t.Errorf("%s FAILED with an empty last_error", id)
			}
			return m
		case never:
			t.Fatalf("%s reached %v though its fault must fail it", id, m.State)
		}
	}
	t.Fatalf("%s never went FAILED", id)
	return nil
}

func testFaults(t *testing.T, h Harness) {
	const timeout = 2 * time.Second
	s := h.start(t, "--seed-count", "16", "--fake-faults", "--configure-timeout", timeout.String(),
		"--drain-timeout", "5s", "--node-ready-exec", "/opt/bigfleet/node-ready")
	sp := speculative(t, s.c, 6)
	for _, id := range sp {
		toIdle(t, s.c, id)
	}
	tests := []struct {
		cluster  string
		minAfter time.Duration // FAILED no sooner than this after the ack
		drain    bool
		hold     time.Duration // stay FAILED this long afterwards
	}{
		{cluster: "fault-error"},
		{cluster: "fault-timeout", minAfter: timeout},
		// The late success arrives at configure-timeout + 30s.
		{cluster: "fault-slow-ok", minAfter: timeout, hold: 32 * time.Second},
		{cluster: "fault-readiness-block", minAfter: timeout},
		{cluster: "fault-drain-error", drain: true},
	}
	for i, tc := range tests {
		id := sp[i]
		t.Run(tc.cluster, func(t *testing.T) {
			t.Parallel()
			began := time.Now()
			providertest.Must(t, "configure")(configure(s.c, t, id, tc.cluster, map[string]string{"f": tc.cluster}, tok{}))
			if tc.drain {
				providertest.WaitState(t, s.c, id, providertest.StConfigured, pollDeadline)
				providertest.Must(t, "drain")(drain(s.c, t, id, tok{}))
				m := waitFailed(t, s.c, id, providertest.StIdle)
				t.Logf("drain failure: %q", m.LastError)
				return
			}
			m := waitFailed(t, s.c, id, providertest.StConfigured)
			if el := time.Since(began); el < tc.minAfter {
				t.Errorf("FAILED after %v, before the %v configure timeout", el, tc.minAfter)
			}
			t.Logf("last_error: %q", m.LastError)
			if tc.hold > 0 {
				for end := time.Now().Add(tc.hold); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
					if g := providertest.Get(t, s.c, id); g.State != providertest.StFailed || g.LastError != m.LastError {
						t.Fatalf("FAILED machine changed after the late success: %v %q", g.State, g.LastError)
					}
				}
			}
		})
	}
}

func testFailedIsSticky(t *testing.T, h Harness) {
	s := h.start(t, "--seed-count", "4", "--fake-faults")
	id := speculative(t, s.c, 1)[0]
	toIdle(t, s.c, id)
	providertest.Must(t, "configure")(configure(s.c, t, id, "fault-error", nil, tok{}))
	failed := waitFailed(t, s.c, id, providertest.StConfigured)
	// Ordered: the fenced calls carry increasing tokens, so each passes
	// the fence and must then be refused because the machine is FAILED.
	calls := []struct {
		name string
		call func() error
	}{
		{"create", func() error { _, err := create(s.c, t, id, tok{}); return err }},
		{"configure same", func() error { _, err := configure(s.c, t, id, "fault-error", nil, tok{}); return err }},
		{"configure other", func() error { _, err := configure(s.c, t, id, "ok", nil, tok{}); return err }},
		{"drain", func() error { _, err := drain(s.c, t, id, tok{}); return err }},
		{"delete", func() error { _, err := del(s.c, t, id, tok{}); return err }},
		{"fenced create", func() error { _, err := create(s.c, t, id, tok{Shard: "s", Epoch: 1, Seq: 1}); return err }},
		{"fenced delete newer", func() error { _, err := del(s.c, t, id, tok{Shard: "s", Epoch: 1, Seq: 2}); return err }},
	}
	for _, c := range calls {
		err := c.call()
		if err == nil || code(err) == codes.FailedPrecondition {
			t.Errorf("%s on FAILED: %v, want a rejection other than FAILED_PRECONDITION", c.name, err)
		}
	}
	providertest.Holds(t, s.c, id, providertest.StFailed, 300*time.Millisecond)
	if diff := protoDiff(failed, providertest.Get(t, s.c, id)); diff != "" {
		t.Errorf("FAILED machine changed (-before +after):\n%s", diff)
	}
	if got := providertest.ListAll(t, s.c, providertest.StFailed); len(got) != 1 || got[0].LastError != failed.LastError {
		t.Errorf("List(FAILED) = %v, want the machine with its last_error verbatim", got)
	}
}

func testCreateFaultOffering(t *testing.T, h Harness) {
	s := h.start(t, "--fake-faults",
		"--offerings", h.offeringsFile(t, "on_demand", 2, map[string]string{"conformance.fault/create": "error"}))
	id := providertest.ListAll(t, s.c, providertest.StSpeculative)[0].Id // every slot carries the fault label
	providertest.Must(t, "create")(create(s.c, t, id, tok{}))
	m := waitFailed(t, s.c, id, providertest.StIdle)
	t.Logf("create failure: %q", m.LastError)
	checkShape(t, m, h.Provider)
}

// With nothing but --fake-faults, the whole conformance fault convention
// works (issue 8 item 13): the readiness gate is active, so
// fault-readiness-block fails the Configure at its timeout, and the default
// offerings hold slots labelled conformance.fault/create=error whose Create
// fails.
func testPlainFakeFaultsConvention(t *testing.T, h Harness) {
	const timeout = 2 * time.Second
	s := h.start(t, "--fake-faults", "--configure-timeout", timeout.String())
	var faulty, plain []string
	for _, m := range providertest.ListAll(t, s.c, providertest.StSpeculative) {
		if m.Labels["conformance.fault/create"] == "error" {
			faulty = append(faulty, m.Id)
		} else {
			plain = append(plain, m.Id)
		}
	}
	if len(faulty) == 0 {
		t.Fatal("the default offerings hold no slot labelled conformance.fault/create=error")
	}
	providertest.Must(t, "create")(create(s.c, t, faulty[0], tok{}))
	waitFailed(t, s.c, faulty[0], providertest.StIdle)

	id := plain[0]
	toIdle(t, s.c, id)
	began := time.Now()
	providertest.Must(t, "configure")(configure(s.c, t, id, "fault-readiness-block", nil, tok{}))
	m := waitFailed(t, s.c, id, providertest.StConfigured)
	if el := time.Since(began); el < timeout {
		t.Errorf("FAILED after %v, before the %v configure timeout", el, timeout)
	}
	t.Logf("readiness block: %q", m.LastError)
}
