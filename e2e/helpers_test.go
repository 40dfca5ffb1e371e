package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// pollDeadline bounds every wait for asynchronous state.
const pollDeadline = 90 * time.Second

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

// speculative returns the ids of n SPECULATIVE machines, skipping the
// slots whose Create the fault convention fails.
func speculative(t testing.TB, c pb.CapacityProviderClient, n int) []string {
	t.Helper()
	var ids []string
	for _, m := range providertest.ListAll(t, c, providertest.StSpeculative) {
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
	providertest.Must(t, "Create "+id)(create(c, t, id, tok{}))
	providertest.WaitState(t, c, id, providertest.StIdle, pollDeadline)
}

// toConfigured walks a SPECULATIVE machine to CONFIGURED.
func toConfigured(t testing.TB, c pb.CapacityProviderClient, id, cluster string, md map[string]string) {
	t.Helper()
	toIdle(t, c, id)
	providertest.Must(t, "Configure "+id)(configure(c, t, id, cluster, md, tok{}))
	providertest.WaitState(t, c, id, providertest.StConfigured, pollDeadline)
}

// vmCreates counts successful VM creations in the simulator (define or
// clone).
func (s *server) vmCreates() float64 {
	return s.Metric("bigfleet_provider_hypervisor_calls_total", `op="define_domain"`, `outcome="ok"`) +
		s.Metric("bigfleet_provider_hypervisor_calls_total", `op="clone_vm"`, `outcome="ok"`)
}

func (s *server) bootstraps() float64 {
	return s.Metric("bigfleet_provider_executor_steps_total", `action="exec-bootstrap"`, `outcome="ok"`)
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
	case providertest.StSpeculative:
		if m.Host != nil {
			add("host set for SPECULATIVE: %v", m.Host)
		}
	case providertest.StIdle, providertest.StConfiguring, providertest.StConfigured, providertest.StDraining:
		if m.Host == nil || m.Host.Ref == "" || m.Host.Provider != provider {
			add("host for %v = %v, want provider %q and a ref", m.State, m.Host, provider)
		}
	}
	switch m.State {
	case providertest.StConfiguring, providertest.StConfigured, providertest.StDraining:
		if m.Cluster == "" {
			add("cluster empty while %v", m.State)
		}
	default:
		if m.Cluster != "" {
			add("cluster %q while %v", m.Cluster, m.State)
		}
	}
	switch m.State {
	case providertest.StSpeculative, providertest.StIdle, providertest.StCreating, providertest.StDeleting:
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
	if m.State == providertest.StFailed && m.LastError == "" {
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
