package providertest

import (
	"context"
	"testing"
	"time"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
)

// The machine states, by the names the suites use.
const (
	StSpeculative = pb.MachineState_MACHINE_STATE_SPECULATIVE
	StCreating    = pb.MachineState_MACHINE_STATE_CREATING
	StIdle        = pb.MachineState_MACHINE_STATE_IDLE
	StConfiguring = pb.MachineState_MACHINE_STATE_CONFIGURING
	StConfigured  = pb.MachineState_MACHINE_STATE_CONFIGURED
	StDraining    = pb.MachineState_MACHINE_STATE_DRAINING
	StDeleting    = pb.MachineState_MACHINE_STATE_DELETING
	StFailed      = pb.MachineState_MACHINE_STATE_FAILED
)

// RPCTimeout bounds one gRPC call the helpers make.
const RPCTimeout = 30 * time.Second

// pollEvery is how often a wait asks again.
const pollEvery = 20 * time.Millisecond

// Get reads one machine; an error fails the test.
func Get(t testing.TB, c pb.CapacityProviderClient, id string) *pb.Machine {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), RPCTimeout)
	defer cancel()
	m, err := c.Get(ctx, &pb.MachineRef{Id: id})
	if err != nil {
		t.Fatalf("Get %s: %v", id, err)
	}
	return m
}

// ListAll lists the machines in states (every machine without states);
// an error fails the test.
func ListAll(t testing.TB, c pb.CapacityProviderClient, states ...pb.MachineState) []*pb.Machine {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), RPCTimeout)
	defer cancel()
	l, err := c.List(ctx, &pb.ListFilter{States: states})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return l.Machines
}

// WaitState polls Get until machine id is in want, for at most max.
// Reaching FAILED while waiting for another state fails the test at once
// with the machine's last_error, as does max passing.
func WaitState(t testing.TB, c pb.CapacityProviderClient, id string, want pb.MachineState, max time.Duration) *pb.Machine {
	t.Helper()
	return WaitFor(t, func() *pb.Machine { return Get(t, c, id) }, id, want, max)
}

// WaitFor is WaitState over any way of reading the machine (a replica
// set reads it from whichever replica leads).
func WaitFor(t testing.TB, get func() *pb.Machine, id string, want pb.MachineState, max time.Duration) *pb.Machine {
	t.Helper()
	deadline := time.Now().Add(max)
	for {
		m := get()
		if m.GetState() == want {
			return m
		}
		if m.GetState() == StFailed {
			t.Fatalf("machine %s went FAILED while waiting for %v: last_error %q", id, want, m.GetLastError())
		}
		if time.Now().After(deadline) {
			t.Fatalf("machine %s still %v after %v, want %v (last_error %q)", id, m.GetState(), max, want, m.GetLastError())
		}
		time.Sleep(pollEvery)
	}
}

// Must fails the test on an RPC error and checks the ack's basic shape
// (an operation id): Must(t, "Create m1")(c.Create(...)).
func Must(t testing.TB, what string) func(*pb.TransitionAck, error) *pb.TransitionAck {
	t.Helper()
	return func(a *pb.TransitionAck, err error) *pb.TransitionAck {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if a.GetOperationId() == "" {
			t.Fatalf("%s: empty operation_id in ack %v", what, a)
		}
		return a
	}
}
