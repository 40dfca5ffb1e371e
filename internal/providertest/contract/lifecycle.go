package contract

import (
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// traceTo polls Get until the machine reaches target, checking the field
// shape of every observation and that only the allowed transitional state
// appears, never after the target was seen. It returns the distinct states
// observed in order.
func traceTo(t *testing.T, c pb.CapacityProviderClient, id string, through, target pb.MachineState, provider string) []pb.MachineState {
	t.Helper()
	var seen []pb.MachineState
	deadline := time.Now().Add(pollDeadline)
	for time.Now().Before(deadline) {
		m := providertest.Get(t, c, id)
		checkShape(t, m, provider)
		if len(seen) == 0 || seen[len(seen)-1] != m.State {
			seen = append(seen, m.State)
		}
		switch m.State {
		case target:
			return seen
		case through:
		default:
			t.Fatalf("machine %s in %v while walking %v->%v (seen %v, last_error %q)", id, m.State, through, target, seen, m.LastError)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("machine %s never reached %v (seen %v)", id, target, seen)
	return nil
}

func testLifecycleTrace(t *testing.T, h Harness) {
	s := h.start(t, "--seed-count", "4", "--fake-latency", "150ms", "--reconcile-interval", "500ms")
	prov := h.Provider
	for _, m := range providertest.ListAll(t, s.c) {
		checkShape(t, m, prov)
	}
	id := speculative(t, s.c, 1)[0]
	md := map[string]string{"pool": "gpu", "owner": "shard-7"}
	ops := map[string]bool{}

	steps := []struct {
		name            string
		do              func() (*pb.TransitionAck, error)
		through, target pb.MachineState
		cluster         string
		md              map[string]string
	}{
		{"create", func() (*pb.TransitionAck, error) { return create(s.c, t, id, tok{}) }, providertest.StCreating, providertest.StIdle, "", nil},
		{"configure", func() (*pb.TransitionAck, error) { return configure(s.c, t, id, "cluster-a", md, tok{}) }, providertest.StConfiguring, providertest.StConfigured, "cluster-a", md},
		{"drain", func() (*pb.TransitionAck, error) { return drain(s.c, t, id, tok{}) }, providertest.StDraining, providertest.StIdle, "", nil},
		{"delete", func() (*pb.TransitionAck, error) { return del(s.c, t, id, tok{}) }, providertest.StDeleting, providertest.StSpeculative, "", nil},
	}
	var hostRef string
	for _, st := range steps {
		ack := providertest.Must(t, st.name)(st.do())
		if ops[ack.OperationId] {
			t.Errorf("%s: operation_id %q reused", st.name, ack.OperationId)
		}
		ops[ack.OperationId] = true
		am := ack.GetMachine()
		if am.GetId() != id {
			t.Fatalf("%s: ack snapshot is of %q, want %q", st.name, am.GetId(), id)
		}
		if am.State != st.through && am.State != st.target {
			t.Errorf("%s: ack snapshot state %v, want %v or %v", st.name, am.State, st.through, st.target)
		}
		checkShape(t, am, prov)
		if am.State == st.through && st.cluster != "" {
			if diff := protoDiff(st.md, am.ShardMetadata); diff != "" {
				t.Errorf("%s: ack shard_metadata (-want +got):\n%s", st.name, diff)
			}
			if am.Cluster != st.cluster {
				t.Errorf("%s: ack cluster %q, want %q", st.name, am.Cluster, st.cluster)
			}
		}
		seen := traceTo(t, s.c, id, st.through, st.target, prov)
		t.Logf("%s: ack %v, observed %v", st.name, am.State, seen)
		m := providertest.Get(t, s.c, id)
		if m.Cluster != st.cluster {
			t.Errorf("%s: settled cluster %q, want %q", st.name, m.Cluster, st.cluster)
		}
		if diff := protoDiff(st.md, m.ShardMetadata); diff != "" && !(len(st.md) == 0 && len(m.ShardMetadata) == 0) {
			t.Errorf("%s: settled shard_metadata (-want +got):\n%s", st.name, diff)
		}
		// The same machine through List.
		var lm *pb.Machine
		for _, x := range providertest.ListAll(t, s.c) {
			if x.Id == id {
				lm = x
			}
		}
		if diff := protoDiff(m, lm); diff != "" {
			t.Errorf("%s: List and Get disagree (-get +list):\n%s", st.name, diff)
		}
		if m.Host != nil {
			if hostRef == "" {
				hostRef = m.Host.Ref
			} else if m.Host.Ref != hostRef {
				t.Errorf("%s: host ref changed %q -> %q within one VM's life", st.name, hostRef, m.Host.Ref)
			}
		}
		providertest.Holds(t, s.c, id, st.target, 1200*time.Millisecond)
	}
	if m := providertest.Get(t, s.c, id); m.Host != nil || m.Cluster != "" || len(m.ShardMetadata) != 0 {
		t.Errorf("after Delete: host %v cluster %q metadata %v, want all cleared", m.Host, m.Cluster, m.ShardMetadata)
	}
}

func testErrorCodes(t *testing.T, h Harness) {
	s := h.start(t, "--seed-count", "6")
	ids := speculative(t, s.c, 3)
	spec, idle, conf := ids[0], ids[1], ids[2]
	toIdle(t, s.c, idle)
	toConfigured(t, s.c, conf, "c1", map[string]string{"k": "v"})
	before := providertest.ListAll(t, s.c)

	const unknown = "nowhere/none/999"
	tests := []struct {
		name string
		id   string // machine that must be unchanged ("" = none)
		call func() error
		want codes.Code
	}{
		{"create empty id", "", func() error { _, err := create(s.c, t, "", tok{}); return err }, codes.InvalidArgument},
		{"configure empty id", "", func() error { _, err := configure(s.c, t, "", "c", nil, tok{}); return err }, codes.InvalidArgument},
		{"drain empty id", "", func() error { _, err := drain(s.c, t, "", tok{}); return err }, codes.InvalidArgument},
		{"delete empty id", "", func() error { _, err := del(s.c, t, "", tok{}); return err }, codes.InvalidArgument},
		{"get empty id", "", func() error { _, err := s.c.Get(ctx(t), &pb.MachineRef{}); return err }, codes.InvalidArgument},
		{"create unknown", "", func() error { _, err := create(s.c, t, unknown, tok{}); return err }, codes.NotFound},
		{"configure unknown", "", func() error { _, err := configure(s.c, t, unknown, "c", nil, tok{}); return err }, codes.NotFound},
		{"drain unknown", "", func() error { _, err := drain(s.c, t, unknown, tok{}); return err }, codes.NotFound},
		{"delete unknown", "", func() error { _, err := del(s.c, t, unknown, tok{}); return err }, codes.NotFound},
		{"get unknown", "", func() error { _, err := s.c.Get(ctx(t), &pb.MachineRef{Id: unknown}); return err }, codes.NotFound},
		{"create on CONFIGURED", conf, func() error { _, err := create(s.c, t, conf, tok{}); return err }, codes.Aborted},
		{"configure on SPECULATIVE", spec, func() error { _, err := configure(s.c, t, spec, "c", nil, tok{}); return err }, codes.Aborted},
		{"drain on IDLE without drain history", idle, func() error { _, err := drain(s.c, t, idle, tok{}); return err }, codes.Aborted},
		{"delete on CONFIGURED", conf, func() error { _, err := del(s.c, t, conf, tok{}); return err }, codes.Aborted},
		{"drain on SPECULATIVE", spec, func() error { _, err := drain(s.c, t, spec, tok{}); return err }, codes.Aborted},
		{"configure on CONFIGURED other cluster", conf, func() error { _, err := configure(s.c, t, conf, "c2", nil, tok{}); return err }, codes.Aborted},
		{"negative grace", conf, func() error {
			_, err := s.c.Drain(ctx(t), &pb.DrainRequest{MachineId: conf, GracePeriodSeconds: -1})
			return err
		}, codes.InvalidArgument},
		{"negative grace on IDLE", idle, func() error {
			_, err := s.c.Drain(ctx(t), &pb.DrainRequest{MachineId: idle, GracePeriodSeconds: -5})
			return err
		}, codes.InvalidArgument},
		{"configure empty cluster", idle, func() error { _, err := configure(s.c, t, idle, "", nil, tok{}); return err }, codes.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var was *pb.Machine
			if tc.id != "" {
				was = providertest.Get(t, s.c, tc.id)
			}
			err := tc.call()
			if got := code(err); got != tc.want {
				t.Errorf("code %v (%v), want %v", got, err, tc.want)
			}
			if code(err) == codes.FailedPrecondition {
				t.Errorf("FAILED_PRECONDITION is reserved for fencing: %v", err)
			}
			if tc.id != "" {
				if diff := protoDiff(was, providertest.Get(t, s.c, tc.id)); diff != "" {
					t.Errorf("machine changed by a rejected call (-before +after):\n%s", diff)
				}
			}
		})
	}
	// Delete on SPECULATIVE may be an idempotent no-op; never FP, never a transition.
	if _, err := del(s.c, t, spec, tok{}); err != nil && (code(err) == codes.FailedPrecondition || code(err) == codes.OK) {
		t.Errorf("Delete on SPECULATIVE: %v", err)
	}
	providertest.Holds(t, s.c, spec, providertest.StSpeculative, 300*time.Millisecond)
	// Never create a machine because an unknown id was named.
	after := providertest.ListAll(t, s.c)
	if len(after) != len(before) {
		t.Errorf("inventory size %d -> %d after calls naming an unknown id", len(before), len(after))
	}
	if !slices.ContainsFunc(after, func(m *pb.Machine) bool { return m.Id == spec && m.State == providertest.StSpeculative }) {
		t.Errorf("SPECULATIVE machine %s changed", spec)
	}
}
