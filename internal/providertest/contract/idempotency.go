package contract

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// opSet records every operation id seen, to prove new cycles mint fresh ones.
type opSet map[string]string

func (o opSet) fresh(t *testing.T, what, op string) {
	t.Helper()
	if prev, ok := o[op]; ok {
		t.Errorf("%s: operation_id %q was already used by %s", what, op, prev)
	}
	o[op] = what
}

func testIdempotentRetries(t *testing.T, h Harness) {
	s := h.start(t, "--seed-count", "4", "--fake-latency", "200ms")
	id := speculative(t, s.c, 1)[0]
	ops := opSet{}
	same := func(what string, want string) func(a *pb.TransitionAck, err error) {
		return func(a *pb.TransitionAck, err error) {
			t.Helper()
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if a.OperationId != want {
				t.Errorf("%s: operation_id %q, want the original %q", what, a.OperationId, want)
			}
		}
	}
	rejected := func(what string, err error) {
		t.Helper()
		if code(err) != codes.Aborted {
			t.Errorf("%s: %v, want Aborted", what, err)
		}
	}
	md := map[string]string{"a": "1"}

	// Create: retried while CREATING and once IDLE.
	op := providertest.Must(t, "create")(create(s.c, t, id, tok{})).OperationId
	ops.fresh(t, "create#1", op)
	if st := providertest.Get(t, s.c, id).State; st != providertest.StCreating {
		t.Logf("note: machine already %v at the first retry", st)
	}
	same("create retry while CREATING", op)(create(s.c, t, id, tok{}))
	providertest.WaitState(t, s.c, id, providertest.StIdle, pollDeadline)
	a, err := create(s.c, t, id, tok{})
	same("create retry on IDLE", op)(a, err)
	if a.GetMachine().GetState() != providertest.StIdle {
		t.Errorf("create retry on IDLE: ack state %v, want IDLE", a.GetMachine().GetState())
	}

	// Configure: retried while CONFIGURING and once CONFIGURED; a
	// conflicting cluster is rejected in both.
	op = providertest.Must(t, "configure")(configure(s.c, t, id, "c1", md, tok{})).OperationId
	ops.fresh(t, "configure#1", op)
	same("configure retry while CONFIGURING", op)(configure(s.c, t, id, "c1", md, tok{}))
	_, err = configure(s.c, t, id, "c2", md, tok{})
	rejected("conflicting configure while CONFIGURING", err)
	providertest.WaitState(t, s.c, id, providertest.StConfigured, pollDeadline)
	same("configure retry on CONFIGURED", op)(configure(s.c, t, id, "c1", md, tok{}))
	_, err = configure(s.c, t, id, "c2", md, tok{})
	rejected("conflicting configure on CONFIGURED", err)
	if m := providertest.Get(t, s.c, id); m.Cluster != "c1" || m.State != providertest.StConfigured {
		t.Errorf("after conflicting configure: %v cluster %q, want CONFIGURED c1", m.State, m.Cluster)
	}

	// Drain, retried, then again on the IDLE it drained to.
	op = providertest.Must(t, "drain")(drain(s.c, t, id, tok{})).OperationId
	ops.fresh(t, "drain#1", op)
	same("drain retry while DRAINING", op)(drain(s.c, t, id, tok{}))
	providertest.WaitState(t, s.c, id, providertest.StIdle, pollDeadline)
	same("drain retry on IDLE after the drain", op)(drain(s.c, t, id, tok{}))

	// A new cycle mints fresh ids.
	op = providertest.Must(t, "configure#2")(configure(s.c, t, id, "c2", map[string]string{"b": "2"}, tok{})).OperationId
	ops.fresh(t, "configure#2", op)
	providertest.WaitState(t, s.c, id, providertest.StConfigured, pollDeadline)
	if m := providertest.Get(t, s.c, id); m.Cluster != "c2" || m.ShardMetadata["a"] != "" {
		t.Errorf("second cycle: cluster %q metadata %v, want c2 without old keys", m.Cluster, m.ShardMetadata)
	}
	ops.fresh(t, "drain#2", providertest.Must(t, "drain#2")(drain(s.c, t, id, tok{})).OperationId)
	providertest.WaitState(t, s.c, id, providertest.StIdle, pollDeadline)
	op = providertest.Must(t, "delete")(del(s.c, t, id, tok{})).OperationId
	ops.fresh(t, "delete#1", op)
	same("delete retry while DELETING", op)(del(s.c, t, id, tok{}))
	providertest.WaitState(t, s.c, id, providertest.StSpeculative, pollDeadline)
	if a, err := del(s.c, t, id, tok{}); err == nil && a.OperationId != op {
		t.Errorf("delete retry on SPECULATIVE: operation_id %q, want %q", a.OperationId, op)
	} else if code(err) == codes.FailedPrecondition {
		t.Errorf("delete retry on SPECULATIVE: %v", err)
	}
	ops.fresh(t, "create#2", providertest.Must(t, "create#2")(create(s.c, t, id, tok{})).OperationId)
	providertest.WaitState(t, s.c, id, providertest.StIdle, pollDeadline)
}

// parallel runs f n times at once, each on its own connection.
func parallel(s *server, n int, f func(c pb.CapacityProviderClient) (*pb.TransitionAck, error)) ([]*pb.TransitionAck, []error) {
	clients := make([]pb.CapacityProviderClient, n)
	for i := range clients {
		clients[i] = s.Dial()
	}
	acks, errs := make([]*pb.TransitionAck, n), make([]error, n)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			acks[i], errs[i] = f(clients[i])
		}()
	}
	close(gate)
	wg.Wait()
	return acks, errs
}

func testParallelRetriesCollapse(t *testing.T, h Harness) {
	const n = 16
	s := h.start(t, "--seed-count", "4", "--fake-latency", "50ms")
	id := speculative(t, s.c, 1)[0]
	vms, boots := s.vmCreates(), s.bootstraps()
	steps := []struct {
		name   string
		call   func(c pb.CapacityProviderClient) (*pb.TransitionAck, error)
		settle pb.MachineState
	}{
		{"create", func(c pb.CapacityProviderClient) (*pb.TransitionAck, error) { return create(c, t, id, tok{}) }, providertest.StIdle},
		{"configure", func(c pb.CapacityProviderClient) (*pb.TransitionAck, error) {
			return configure(c, t, id, "c1", map[string]string{"k": "v"}, tok{})
		}, providertest.StConfigured},
		{"drain", func(c pb.CapacityProviderClient) (*pb.TransitionAck, error) { return drain(c, t, id, tok{}) }, providertest.StIdle},
		{"delete", func(c pb.CapacityProviderClient) (*pb.TransitionAck, error) { return del(c, t, id, tok{}) }, providertest.StSpeculative},
	}
	for _, st := range steps {
		acks, errs := parallel(s, n, st.call)
		got := map[string]int{}
		for i := range n {
			if errs[i] != nil {
				got[fmt.Sprintf("error %v", code(errs[i]))]++
				continue
			}
			got[acks[i].OperationId]++
		}
		if len(got) != 1 {
			t.Errorf("%s: %d identical parallel retries gave %v, want one operation id", st.name, n, got)
		}
		providertest.WaitState(t, s.c, id, st.settle, pollDeadline)
		switch st.name {
		case "create":
			if d := s.vmCreates() - vms; d != 1 {
				t.Errorf("create: %v VMs created by %d identical retries, want 1", d, n)
			}
		case "configure":
			if d := s.bootstraps() - boots; d != 1 {
				t.Errorf("configure: %v bootstrap runs for %d identical retries, want 1", d, n)
			}
		}
	}
}

func testConflictingMutationsRace(t *testing.T, h Harness) {
	s := h.start(t, "--seed-count", "8")
	ids := speculative(t, s.c, 4)
	for _, id := range ids {
		toIdle(t, s.c, id)
	}
	for round, id := range ids {
		// From IDLE both Configure and Delete are legal edges, and so
		// is Configure to either cluster: at most one may win.
		calls := []func(c pb.CapacityProviderClient) (*pb.TransitionAck, error){
			func(c pb.CapacityProviderClient) (*pb.TransitionAck, error) {
				return configure(c, t, id, "x", nil, tok{})
			},
			func(c pb.CapacityProviderClient) (*pb.TransitionAck, error) {
				return configure(c, t, id, "y", nil, tok{})
			},
			func(c pb.CapacityProviderClient) (*pb.TransitionAck, error) { return del(c, t, id, tok{}) },
		}
		var mu sync.Mutex
		var wins []string
		var wg sync.WaitGroup
		gate := make(chan struct{})
		for i := range 6 {
			c := s.Dial()
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				a, err := calls[(i+round)%len(calls)](c)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					// Identical retries of the winner are idempotent
					// successes; the key is the op id plus the target
					// its snapshot shows.
					target := map[pb.MachineState]string{providertest.StConfiguring: "configure", providertest.StConfigured: "configure",
						providertest.StDeleting: "delete", providertest.StSpeculative: "delete"}[a.Machine.State]
					if target == "" {
						t.Errorf("ack snapshot in %v, not the transitional or settled state of Configure or Delete", a.Machine.State)
					}
					wins = append(wins, fmt.Sprintf("%s/%s/%s", a.OperationId, target, a.Machine.Cluster))
				case code(err) == codes.FailedPrecondition:
					t.Errorf("conflict answered FAILED_PRECONDITION: %v", err)
				}
			}()
		}
		close(gate)
		wg.Wait()
		distinct := map[string]bool{}
		for _, w := range wins {
			distinct[w] = true
		}
		if len(distinct) > 1 {
			t.Errorf("machine %s: conflicting mutations accepted: %v", id, wins)
		}
		if len(distinct) == 0 {
			t.Errorf("machine %s: no mutation accepted", id)
		}
		m := waitSettled(t, s.c, id)
		t.Logf("machine %s: accepted %v, settled %v cluster %q", id, wins, m.State, m.Cluster)
		if len(wins) > 0 {
			var op, target, cluster string
			fmt.Sscanf(strings.ReplaceAll(wins[0], "/", " "), "%s %s %s", &op, &target, &cluster)
			want := map[string]pb.MachineState{"configure": providertest.StConfigured, "delete": providertest.StSpeculative}[target]
			if m.State != want || m.Cluster != cluster {
				t.Errorf("machine %s settled %v cluster %q, want the winner's %v cluster %q", id, m.State, m.Cluster, want, cluster)
			}
		}
	}
}
