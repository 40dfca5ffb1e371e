package providertest

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"testing"
	"time"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/jsonplan"
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

// SettleDeadline bounds the helpers' waits for a machine to settle.
const SettleDeadline = 90 * time.Second

// Token is a fencing token; the zero value is "unfenced".
type Token struct {
	Shard      string
	Epoch, Seq int64
}

// call returns a context bounded by RPCTimeout, cancelled when the test
// ends (a call's context must outlive it only as long as the call).
func call(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), RPCTimeout)
	t.Cleanup(cancel)
	return ctx
}

// Create sends a Create with token k.
func Create(c pb.CapacityProviderClient, t testing.TB, id string, k Token) (*pb.TransitionAck, error) {
	return c.Create(call(t), &pb.CreateRequest{MachineId: id, ShardId: k.Shard, ShardEpoch: k.Epoch, SequenceNumber: k.Seq})
}

// Configure sends a Configure to cluster with a small shell blob and md.
func Configure(c pb.CapacityProviderClient, t testing.TB, id, cluster string, md map[string]string, k Token) (*pb.TransitionAck, error) {
	return c.Configure(call(t), &pb.ConfigureRequest{MachineId: id, ClusterId: cluster, BootstrapBlob: []byte("#!/bin/sh\necho hi\n"),
		ShardMetadata: md, ShardId: k.Shard, ShardEpoch: k.Epoch, SequenceNumber: k.Seq})
}

// Drain sends a Drain with the default grace.
func Drain(c pb.CapacityProviderClient, t testing.TB, id string, k Token) (*pb.TransitionAck, error) {
	return c.Drain(call(t), &pb.DrainRequest{MachineId: id, ShardId: k.Shard, ShardEpoch: k.Epoch, SequenceNumber: k.Seq})
}

// Delete sends a Delete.
func Delete(c pb.CapacityProviderClient, t testing.TB, id string, k Token) (*pb.TransitionAck, error) {
	return c.Delete(call(t), &pb.DeleteRequest{MachineId: id, ShardId: k.Shard, ShardEpoch: k.Epoch, SequenceNumber: k.Seq})
}

// Speculative returns the ids of n SPECULATIVE machines, skipping the
// slots whose Create the conformance fault convention fails; fewer fails
// the test.
func Speculative(t testing.TB, c pb.CapacityProviderClient, n int) []string {
	t.Helper()
	var ids []string
	for _, m := range ListAll(t, c, StSpeculative) {
		if len(ids) == n {
			break
		}
		if m.Labels["conformance.fault/create"] == "error" {
			continue
		}
		ids = append(ids, m.Id)
	}
	if len(ids) < n {
		t.Fatalf("want %d SPECULATIVE machines, have %d", n, len(ids))
	}
	return ids
}

// ToIdle creates a machine and waits until IDLE (SettleDeadline).
func ToIdle(t testing.TB, c pb.CapacityProviderClient, id string) {
	t.Helper()
	Must(t, "Create "+id)(Create(c, t, id, Token{}))
	WaitState(t, c, id, StIdle, SettleDeadline)
}

// ToConfigured walks a SPECULATIVE machine to CONFIGURED in cluster with
// md.
func ToConfigured(t testing.TB, c pb.CapacityProviderClient, id, cluster string, md map[string]string) {
	t.Helper()
	ToIdle(t, c, id)
	Must(t, "Configure "+id)(Configure(c, t, id, cluster, md, Token{}))
	WaitState(t, c, id, StConfigured, SettleDeadline)
}

// Stable reports whether st is a settled state (not a transition).
func Stable(st pb.MachineState) bool {
	switch st {
	case StSpeculative, StIdle, StConfigured, StFailed:
		return true
	}
	return false
}

// WaitSettled polls until the machine is in a stable state and returns
// it; SettleDeadline passing fails the test.
func WaitSettled(t testing.TB, c pb.CapacityProviderClient, id string) *pb.Machine {
	t.Helper()
	for end := time.Now().Add(SettleDeadline); time.Now().Before(end); time.Sleep(15 * time.Millisecond) {
		if m := Get(t, c, id); Stable(m.State) {
			return m
		}
	}
	t.Fatalf("machine %s never settled within %v", id, SettleDeadline)
	return nil
}

var memRE = regexp.MustCompile(`^([0-9]+)(Gi|Mi)$`)

// ShapeProblems lists every field-shape rule of the wire schema m breaks.
// provider is the host.provider a placed machine must report; empty
// accepts any non-empty one.
func ShapeProblems(m *pb.Machine, provider string) []string {
	var p []string
	add := func(f string, a ...any) { p = append(p, fmt.Sprintf(f, a...)) }
	if m.State == pb.MachineState_MACHINE_STATE_UNSPECIFIED {
		add("state UNSPECIFIED")
	}
	if m.InstanceType == "" || m.Zone == "" || m.CapacityType == pb.CapacityType_CAPACITY_TYPE_UNSPECIFIED {
		add("instance_type/zone/capacity_type not all set at top level: %q %q %v", m.InstanceType, m.Zone, m.CapacityType)
	}
	switch m.State {
	case StSpeculative:
		if m.Host != nil {
			add("host set for SPECULATIVE: %v", m.Host)
		}
	case StIdle, StConfiguring, StConfigured, StDraining:
		if m.Host == nil || m.Host.Ref == "" || m.Host.Provider == "" || (provider != "" && m.Host.Provider != provider) {
			add("host for %v = %v, want provider %q and a ref", m.State, m.Host, provider)
		}
	}
	switch m.State {
	case StConfiguring, StConfigured, StDraining:
		if m.Cluster == "" {
			add("cluster empty while %v", m.State)
		}
	default:
		if m.Cluster != "" {
			add("cluster %q while %v", m.Cluster, m.State)
		}
	}
	switch m.State {
	case StSpeculative, StIdle, StCreating, StDeleting:
		if len(m.ShardMetadata) != 0 {
			add("shard_metadata %v while %v", m.ShardMetadata, m.State)
		}
	}
	if math.IsNaN(m.PricePerHour) || math.IsInf(m.PricePerHour, 0) || m.PricePerHour < 0 {
		add("price_per_hour %v", m.PricePerHour)
	}
	if m.CapacityType == pb.CapacityType_CAPACITY_TYPE_BARE_METAL && m.PricePerHour != 0 {
		add("bare_metal price %v, want 0", m.PricePerHour)
	}
	if m.InterruptionProbability != 0 {
		add("interruption_probability %v, want 0", m.InterruptionProbability)
	}
	for name, r := range map[string]*pb.Resources{"resources": m.Resources, "allocatable": m.Allocatable} {
		if len(r.GetResources()) == 0 {
			add("%s empty", name)
			continue
		}
		if name == "allocatable" && (r.Resources["cpu"] == "" || r.Resources["memory"] == "") {
			add("allocatable lacks cpu or memory: %v", r.Resources)
		}
		if mem, ok := r.Resources["memory"]; ok {
			sm := memRE.FindStringSubmatch(mem)
			if sm == nil {
				add("%s memory %q is not NGi/NMi", name, mem)
			} else if n, _ := strconv.Atoi(sm[1]); sm[2] == "Mi" && n%1024 == 0 {
				add("%s memory %q is a whole number of GiB but rendered in Mi", name, mem)
			}
		}
	}
	if m.State == StFailed && m.LastError == "" {
		add("FAILED without last_error")
	}
	return p
}

// CheckShape reports every ShapeProblems of m as a test error.
func CheckShape(t testing.TB, m *pb.Machine, provider string) {
	t.Helper()
	for _, p := range ShapeProblems(m, provider) {
		t.Errorf("machine %s (%v): %s", m.Id, m.State, p)
	}
}

// Holds polls Get for d and fails the test if the machine leaves state
// st (no flapping back into a transition from reconcile ticks).
func Holds(t testing.TB, c pb.CapacityProviderClient, id string, st pb.MachineState, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(25 * time.Millisecond) {
		if m := Get(t, c, id); m.State != st {
			t.Fatalf("machine %s left settled state %v for %v (last_error %q)", id, st, m.State, m.LastError)
		}
	}
}

// IDs are the machines' ids, sorted.
func IDs(ms []*pb.Machine) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Id
	}
	sort.Strings(out)
	return out
}

// RawCodec sends pre-encoded bytes (a *[]byte) and receives the reply's
// bytes, so a request can carry what the Go protobuf runtime refuses to
// marshal (invalid UTF-8 in a string): pass grpc.ForceCodec(RawCodec{})
// to Conn().Invoke.
type RawCodec struct{}

// Marshal returns the bytes v points to.
func (RawCodec) Marshal(v any) ([]byte, error) {
	if b, ok := v.(*[]byte); ok {
		return *b, nil
	}
	return nil, fmt.Errorf("providertest.RawCodec: %T", v)
}

// Unmarshal copies data into the *[]byte v.
func (RawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("providertest.RawCodec: %T", v)
	}
	*b = append([]byte(nil), data...)
	return nil
}

// Name is "proto": the server decodes the bytes as the protobuf they are.
func (RawCodec) Name() string { return "proto" }

// HasDrift reports whether plan p reports drift of kind in zone.
func HasDrift(p *jsonplan.Plan, zone, kind string) bool {
	for _, d := range p.Drift {
		if d.Zone == zone && d.Kind == kind {
			return true
		}
	}
	return false
}
