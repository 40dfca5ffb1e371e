package contract

import (
	"testing"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// Black-box regressions for issue 8: what a shard (or an attacker) can do
// over the wire. Each failed against the provider before the fix.

// Three cursor-less List(states=[SPECULATIVE], max_results=1) calls hand
// out three different machines, so shards picking capacity this way do
// not all contend for one slot.
func testCursorlessPagesHandOutDifferentMachines(t *testing.T, h Harness) {
	s := h.start(t, "--seed-count", "16")
	seen := map[string]bool{}
	for range 3 {
		l, err := s.c.List(ctx(t), &pb.ListFilter{States: []pb.MachineState{providertest.StSpeculative}, MaxResults: 1})
		if err != nil || len(l.Machines) != 1 {
			t.Fatalf("List: %v %v", err, l)
		}
		seen[l.Machines[0].Id] = true
	}
	if len(seen) != 3 {
		t.Errorf("3 pickers got %d distinct machines", len(seen))
	}
	// And a paged walk from such a start still sees every machine once.
	all := map[string]int{}
	var cur []byte
	for range 100 {
		l, err := s.c.List(ctx(t), &pb.ListFilter{MaxResults: 5, SinceRevision: cur})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Machines) == 0 {
			break
		}
		for _, m := range l.Machines {
			all[m.Id]++
		}
		cur = l.Revision
	}
	if len(all) != 16 {
		t.Errorf("paged walk saw %d of 16 machines", len(all))
	}
	for id, n := range all {
		if n != 1 {
			t.Errorf("%s seen %d times", id, n)
		}
	}
}

// An empty bootstrap blob is a valid, empty file for the hook (it used to
// fail with "no longer in memory (the provider restarted)"), and a failed
// Configure clears both cluster and shard_metadata.
func testEmptyBlobAndFailedConfigure(t *testing.T, h Harness) {
	s := h.start(t, "--seed-count", "4", "--fake-faults")
	ids := speculative(t, s.c, 2)
	toIdle(t, s.c, ids[0])
	toIdle(t, s.c, ids[1])
	if _, err := s.c.Configure(ctx(t), &pb.ConfigureRequest{MachineId: ids[0], ClusterId: "c1", BootstrapBlob: []byte{}}); err != nil {
		t.Fatal(err)
	}
	providertest.WaitState(t, s.c, ids[0], providertest.StConfigured, pollDeadline)
	providertest.Must(t, "configure")(configure(s.c, t, ids[1], "fault-error", map[string]string{"k": "v"}, tok{}))
	m := waitFailed(t, s.c, ids[1], providertest.StConfigured)
	if m.Cluster != "" || len(m.ShardMetadata) != 0 {
		t.Errorf("failed configure kept cluster %q metadata %v", m.Cluster, m.ShardMetadata)
	}
}
