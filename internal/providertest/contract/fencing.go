package contract

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// fenceModel is the oracle: per (shard, machine) the highest accepted
// (epoch, seq).
type fenceModel map[[2]string][2]int64

// admit reports whether the token passes and advances the mark if so.
func (f fenceModel) admit(machine string, k tok) bool {
	if k.Shard == "" && k.Epoch == 0 && k.Seq == 0 {
		return true
	}
	key := [2]string{k.Shard, machine}
	m, ok := f[key]
	if ok && (k.Epoch < m[0] || (k.Epoch == m[0] && k.Seq <= m[1])) {
		return false
	}
	f[key] = [2]int64{k.Epoch, k.Seq}
	return true
}

// fencedCall is one mutation with a token, possibly malformed in its other
// arguments.
type fencedCall struct {
	kind    string
	badArgs bool
}

func (fc fencedCall) do(t testing.TB, c pb.CapacityProviderClient, id string, k tok) error {
	var err error
	switch fc.kind {
	case "create":
		_, err = create(c, t, id, k)
	case "configure":
		cluster := "c1"
		if fc.badArgs {
			cluster = ""
		}
		_, err = configure(c, t, id, cluster, map[string]string{"m": "v"}, k)
	case "drain":
		grace := int64(0)
		if fc.badArgs {
			grace = -1
		}
		_, err = c.Drain(ctx(t), &pb.DrainRequest{MachineId: id, GracePeriodSeconds: grace, ShardId: k.Shard, ShardEpoch: k.Epoch, SequenceNumber: k.Seq})
	case "delete":
		_, err = del(c, t, id, k)
	}
	return err
}

func testFencingOracle(t *testing.T, h Harness) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 42))
	s := h.start(t, "--seed-count", "6")
	// Unknown ids are left to TestFencingRules: the provider keeps no
	// marks for them (see the "unknown id stale" case), and one such
	// divergence would end the walk here.
	machines := speculative(t, s.c, 3)
	unknown := ""
	shards := []string{"s1", "s2", "s3"}
	kinds := []string{"create", "configure", "drain", "delete"}
	model := fenceModel{}
	pick := func(n int64) int64 {
		switch r := rng.IntN(20); {
		case r == 0:
			return math.MaxInt64
		case r == 1:
			return -1 - rng.Int64N(3)
		default:
			return rng.Int64N(n)
		}
	}
	for i := range 400 {
		id := machines[rng.IntN(len(machines))]
		fc := fencedCall{kind: kinds[rng.IntN(len(kinds))], badArgs: rng.IntN(5) == 0}
		k := tok{Shard: shards[rng.IntN(len(shards))], Epoch: pick(3), Seq: pick(4)}
		if rng.IntN(15) == 0 {
			k = tok{}
		}
		var before *pb.Machine
		if id != unknown {
			before = waitSettled(t, s.c, id)
		}
		err := fc.do(t, s.c, id, k)
		step := fmt.Sprintf("#%d %s(%s, bad=%v) token %+v", i, fc.kind, id, fc.badArgs, k)
		// Negative tokens are ordinary int64 pairs: stale ones are
		// fenced, newer ones and first contacts pass.
		if !model.admit(id, k) {
			if code(err) != codes.FailedPrecondition {
				t.Errorf("%s: %v, want FailedPrecondition (stale token)", step, err)
			}
			if before != nil {
				if diff := protoDiff(before, providertest.Get(t, s.c, id)); diff != "" {
					t.Errorf("%s: fenced call changed the machine (-before +after):\n%s", step, diff)
				}
			}
			continue
		}
		if code(err) == codes.FailedPrecondition {
			t.Errorf("%s: fenced (%v) but the token is newer than the mark", step, err)
		}
		switch {
		case id == unknown && code(err) != codes.NotFound:
			t.Errorf("%s: %v, want NotFound after the fence passed", step, err)
		case id != unknown && fc.badArgs && (fc.kind == "configure" || fc.kind == "drain") && code(err) != codes.InvalidArgument && code(err) != codes.Aborted:
			t.Errorf("%s: %v, want InvalidArgument (or Aborted when out of position)", step, err)
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	// Get and List carry no token and are never fenced.
	for _, id := range machines {
		providertest.Get(t, s.c, id)
	}
	providertest.ListAll(t, s.c)
}

func testFencingRules(t *testing.T, h Harness) {
	s := h.start(t, "--seed-count", "8")
	ids := speculative(t, s.c, 4)
	a, b, c2, d := ids[0], ids[1], ids[2], ids[3]
	toIdle(t, s.c, b)
	toIdle(t, s.c, d)
	max := int64(math.MaxInt64)
	type call struct {
		name string
		err  func() error
		want codes.Code
	}
	steps := []call{
		// First contact with int64 max values, then the same again.
		{"max token first contact", func() error { _, err := create(s.c, t, a, tok{Shard: "s1", Epoch: max, Seq: max}); return err }, codes.OK},
		{"max token repeated is stale", func() error { _, err := create(s.c, t, a, tok{Shard: "s1", Epoch: max, Seq: max}); return err }, codes.FailedPrecondition},
		{"max epoch lower seq is stale", func() error { _, err := create(s.c, t, a, tok{Shard: "s1", Epoch: max, Seq: 0}); return err }, codes.FailedPrecondition},
		// Isolation: other shard, other machine.
		{"other shard same machine", func() error { _, err := create(s.c, t, a, tok{Shard: "s2", Epoch: 0, Seq: 1}); return err }, codes.OK},
		{"same shard other machine", func() error { _, err := create(s.c, t, c2, tok{Shard: "s1", Epoch: 0, Seq: 1}); return err }, codes.OK},
		// Unfenced always passes.
		{"all-zero token", func() error { _, err := create(s.c, t, a, tok{}); return err }, codes.OK},
		// Stale before NotFound.
		{"unknown id first contact", func() error { _, err := create(s.c, t, "ghost/x/1", tok{Shard: "s1", Epoch: 5, Seq: 5}); return err }, codes.NotFound},
		{"unknown id stale", func() error { _, err := create(s.c, t, "ghost/x/1", tok{Shard: "s1", Epoch: 5, Seq: 5}); return err }, codes.FailedPrecondition},
		// Mark advances on a rejected (out of position) op.
		{"drain on IDLE passes fence, rejected", func() error { _, err := drain(s.c, t, b, tok{Shard: "s1", Epoch: 2, Seq: 7}); return err }, codes.Aborted},
		{"same token now stale", func() error { _, err := drain(s.c, t, b, tok{Shard: "s1", Epoch: 2, Seq: 7}); return err }, codes.FailedPrecondition},
		{"older token stale, before arg check", func() error {
			_, err := s.c.Drain(ctx(t), &pb.DrainRequest{MachineId: b, GracePeriodSeconds: -1, ShardId: "s1", ShardEpoch: 2, SequenceNumber: 6})
			return err
		}, codes.FailedPrecondition},
		{"higher epoch any seq", func() error { _, err := create(s.c, t, b, tok{Shard: "s1", Epoch: 3, Seq: 0}); return err }, codes.OK},
		// Stale before the idempotency short-circuit.
		{"idempotent retry with stale token", func() error { _, err := create(s.c, t, b, tok{Shard: "s1", Epoch: 3, Seq: 0}); return err }, codes.FailedPrecondition},
		// Negative values are plain int64s: a first contact passes, a
		// newer one passes, a stale one is fenced before anything else.
		{"negative first contact", func() error { _, err := create(s.c, t, d, tok{Shard: "s9", Epoch: -1, Seq: 0}); return err }, codes.OK},
		{"negative stale", func() error { _, err := create(s.c, t, d, tok{Shard: "s9", Epoch: -1, Seq: -1}); return err }, codes.FailedPrecondition},
		{"negative newer", func() error { _, err := create(s.c, t, d, tok{Shard: "s9", Epoch: 0, Seq: -1}); return err }, codes.OK},
		{"stale and negative on a mark (6,1)", func() error {
			if _, err := create(s.c, t, d, tok{Shard: "s8", Epoch: 6, Seq: 1}); err != nil {
				return err
			}
			_, err := create(s.c, t, d, tok{Shard: "s8", Epoch: 6, Seq: -1})
			return err
		}, codes.FailedPrecondition},
		// Fence keys are unambiguous: NUL in the ids cannot make two
		// pairs share a mark.
		{"NUL pair first contact", func() error { _, err := create(s.c, t, "zz\x00"+c2, tok{Shard: "A", Epoch: 1, Seq: 1}); return err }, codes.NotFound},
		{"other NUL pair first contact", func() error { _, err := create(s.c, t, c2, tok{Shard: "A\x00zz", Epoch: 1, Seq: 1}); return err }, codes.OK},
		// Empty machine_id: the fence check runs first, so a token
		// that passes still ends InvalidArgument.
		{"empty id", func() error { _, err := create(s.c, t, "", tok{Shard: "s1", Epoch: 1, Seq: 1}); return err }, codes.InvalidArgument},
	}
	for _, st := range steps {
		if got := code(st.err()); got != st.want {
			t.Errorf("%s: code %v, want %v", st.name, got, st.want)
		}
	}
	if _, err := s.c.Get(ctx(t), &pb.MachineRef{Id: a}); err != nil {
		t.Errorf("Get after fencing: %v", err)
	}
	if _, err := s.c.List(ctx(t), &pb.ListFilter{}); err != nil {
		t.Errorf("List after fencing: %v", err)
	}
}
