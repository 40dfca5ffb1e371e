package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
)

const (
	stSpec        = pb.MachineState_MACHINE_STATE_SPECULATIVE
	stCreating    = pb.MachineState_MACHINE_STATE_CREATING
	stIdle        = pb.MachineState_MACHINE_STATE_IDLE
	stConfiguring = pb.MachineState_MACHINE_STATE_CONFIGURING
	stConfigured  = pb.MachineState_MACHINE_STATE_CONFIGURED
	stDraining    = pb.MachineState_MACHINE_STATE_DRAINING
	stDeleting    = pb.MachineState_MACHINE_STATE_DELETING
	stFailed      = pb.MachineState_MACHINE_STATE_FAILED
)

// pollDeadline bounds every wait for asynchronous state.
const pollDeadline = 90 * time.Second

func get(t testing.TB, c pb.CapacityProviderClient, id string) *pb.Machine {
	t.Helper()
	m, err := c.Get(ctx(t), &pb.MachineRef{Id: id})
	if err != nil {
		t.Fatalf("Get %s: %v", id, err)
	}
	return m
}

// waitState polls Get until the machine is in want. Reaching FAILED while
// waiting for something else is fatal.
func waitState(t testing.TB, c pb.CapacityProviderClient, id string, want pb.MachineState) *pb.Machine {
	t.Helper()
	deadline := time.Now().Add(pollDeadline)
	var m *pb.Machine
	for time.Now().Before(deadline) {
		m = get(t, c, id)
		if m.State == want {
			return m
		}
		if m.State == stFailed {
			t.Fatalf("machine %s went FAILED while waiting for %v: %q", id, want, m.LastError)
		}
		time.Sleep(15 * time.Millisecond)
	}
	t.Fatalf("machine %s still %v after %v, want %v", id, m.GetState(), pollDeadline, want)
	return nil
}

// tok is a fencing token; the zero value is "unfenced".
type tok struct {
	shard      string
	epoch, seq int64
}

func create(c pb.CapacityProviderClient, t testing.TB, id string, k tok) (*pb.TransitionAck, error) {
	return c.Create(ctx(t), &pb.CreateRequest{MachineId: id, ShardId: k.shard, ShardEpoch: k.epoch, SequenceNumber: k.seq})
}

func configure(c pb.CapacityProviderClient, t testing.TB, id, cluster string, md map[string]string, k tok) (*pb.TransitionAck, error) {
	return c.Configure(ctx(t), &pb.ConfigureRequest{MachineId: id, ClusterId: cluster, BootstrapBlob: []byte("#!/bin/sh\necho hi\n"),
		ShardMetadata: md, ShardId: k.shard, ShardEpoch: k.epoch, SequenceNumber: k.seq})
}

func drain(c pb.CapacityProviderClient, t testing.TB, id string, k tok) (*pb.TransitionAck, error) {
	return c.Drain(ctx(t), &pb.DrainRequest{MachineId: id, ShardId: k.shard, ShardEpoch: k.epoch, SequenceNumber: k.seq})
}

func del(c pb.CapacityProviderClient, t testing.TB, id string, k tok) (*pb.TransitionAck, error) {
	return c.Delete(ctx(t), &pb.DeleteRequest{MachineId: id, ShardId: k.shard, ShardEpoch: k.epoch, SequenceNumber: k.seq})
}

// must fails the test on an RPC error and checks the ack's basic shape.
func must(t testing.TB, what string) func(*pb.TransitionAck, error) *pb.TransitionAck {
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

func listAll(t testing.TB, c pb.CapacityProviderClient, states ...pb.MachineState) []*pb.Machine {
	t.Helper()
	l, err := c.List(ctx(t), &pb.ListFilter{States: states})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return l.Machines
}

// speculative returns the ids of n SPECULATIVE machines, skipping the
// slots whose Create the fault convention fails.
func speculative(t testing.TB, c pb.CapacityProviderClient, n int) []string {
	t.Helper()
	var ids []string
	for _, m := range listAll(t, c, stSpec) {
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

// toIdle creates a machine and waits until IDLE.
func toIdle(t testing.TB, c pb.CapacityProviderClient, id string) {
	t.Helper()
	must(t, "Create "+id)(create(c, t, id, tok{}))
	waitState(t, c, id, stIdle)
}

// toConfigured walks a SPECULATIVE machine to CONFIGURED.
func toConfigured(t testing.TB, c pb.CapacityProviderClient, id, cluster string, md map[string]string) {
	t.Helper()
	toIdle(t, c, id)
	must(t, "Configure "+id)(configure(c, t, id, cluster, md, tok{}))
	waitState(t, c, id, stConfigured)
}

// metric sums the samples of a Prometheus metric whose label set contains
// every given label pair (`op="clone_vm"`).
func (s *server) metric(name string, labels ...string) float64 {
	s.T().Helper()
	var sum float64
	_, body := s.HTTPGet("/metrics")
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(line, l) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// vmCreates counts successful VM creations in the simulator (define or
// clone).
func (s *server) vmCreates() float64 {
	return s.metric("bigfleet_provider_hypervisor_calls_total", `op="define_domain"`, `outcome="ok"`) +
		s.metric("bigfleet_provider_hypervisor_calls_total", `op="clone_vm"`, `outcome="ok"`)
}

func (s *server) bootstraps() float64 {
	return s.metric("bigfleet_provider_executor_steps_total", `action="exec-bootstrap"`, `outcome="ok"`)
}

var memRE = regexp.MustCompile(`^([0-9]+)(Gi|Mi)$`)

// shapeProblems lists every field-shape rule m breaks.
func shapeProblems(m *pb.Machine, provider string) []string {
	var p []string
	add := func(f string, a ...any) { p = append(p, fmt.Sprintf(f, a...)) }
	if m.State == pb.MachineState_MACHINE_STATE_UNSPECIFIED {
		add("state UNSPECIFIED")
	}
	if m.InstanceType == "" || m.Zone == "" || m.CapacityType == pb.CapacityType_CAPACITY_TYPE_UNSPECIFIED {
		add("instance_type/zone/capacity_type not all set at top level: %q %q %v", m.InstanceType, m.Zone, m.CapacityType)
	}
	switch m.State {
	case stSpec:
		if m.Host != nil {
			add("host set for SPECULATIVE: %v", m.Host)
		}
	case stIdle, stConfiguring, stConfigured, stDraining:
		if m.Host == nil || m.Host.Ref == "" || m.Host.Provider != provider {
			add("host for %v = %v, want provider %q and a ref", m.State, m.Host, provider)
		}
	}
	switch m.State {
	case stConfiguring, stConfigured, stDraining:
		if m.Cluster == "" {
			add("cluster empty while %v", m.State)
		}
	default:
		if m.Cluster != "" {
			add("cluster %q while %v", m.Cluster, m.State)
		}
	}
	switch m.State {
	case stSpec, stIdle, stCreating, stDeleting:
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
	if m.State == stFailed && m.LastError == "" {
		add("FAILED without last_error")
	}
	return p
}

func checkShape(t testing.TB, m *pb.Machine, provider string) {
	t.Helper()
	for _, p := range shapeProblems(m, provider) {
		t.Errorf("machine %s (%v): %s", m.Id, m.State, p)
	}
}

func providerOf(sh shape) string {
	if sh.name == "proxmox" {
		return "proxmox"
	}
	return "libvirt"
}

// protoEqual compares messages with go-cmp.
func protoDiff(want, got any) string { return cmp.Diff(want, got, protocmp.Transform()) }

// offeringsFile writes a one-offering file for the shape's small type in
// its first zone and returns its path.
func offeringsFile(t testing.TB, sh shape, capacity string, count int, labels map[string]string) string {
	t.Helper()
	zone, typ := "local-a", "kvm.small"
	if sh.name == "proxmox" {
		zone, typ = "pve-a", "pve.small"
	}
	off := []map[string]any{{"instance_type": typ, "zone": zone, "capacity_type": capacity, "count": count}}
	if labels != nil {
		off[0]["labels"] = labels
	}
	b, err := json.Marshal(off)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "offerings.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func sleepPoll() { time.Sleep(15 * time.Millisecond) }

func get2(s *server, id string) (*pb.Machine, error) {
	return s.c.Get(ctx(s.T()), &pb.MachineRef{Id: id})
}
