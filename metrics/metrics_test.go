package metrics_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox"
	"github.com/bigfleet-vm/provider/internal/providertest"
	"github.com/bigfleet-vm/provider/naming"
	"github.com/bigfleet-vm/provider/plugin"
	"github.com/bigfleet-vm/provider/server"
)

// harness is a provider on the libvirt-shaped simulator, served on
// loopback, with a gRPC client and an HTTP client for /metrics and /admin.
type harness struct {
	t       *testing.T
	metrics string
	client  pb.CapacityProviderClient
}

func start(t *testing.T) (*harness, *config.Config) {
	t.Helper()
	addrs := providertest.FreeAddrs(t, 2)
	grpcAddr, metricsAddr := addrs[0], addrs[1]
	cfg, err := config.Parse(plugin.MustRegistry(libvirt.Plugin(), proxmox.Plugin()), []string{"--use-fake-backend", "--installation-id", "mt", "--seed-count", "6",
		"--state", filepath.Join(t.TempDir(), "state"), "--addr", grpcAddr, "--metrics-addr", metricsAddr,
		"--reconcile-interval", "0", "--shutdown-grace", "2s", "--fake-admin",
		// Drift is reported until the machine's own reconcile acts on it (a
		// repair, a failure, an adoption). Repairs are held for the whole
		// test, so a repairable drift stays visible to polling scrapes
		// however slow they are; the latency widens the window of the
		// others (failures and adoptions are never held).
		"--drift-repair-delay", "1h", "--fake-latency", "200ms"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return serve(t, cfg, grpcAddr, metricsAddr), cfg
}

// serve runs a provider built from cfg until the test ends.
func serve(t *testing.T, cfg *config.Config, grpcAddr, metricsAddr string) *harness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p, err := server.Build(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		p.Close()
	})
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	h := &harness{t: t, metrics: "http://" + metricsAddr, client: pb.NewCapacityProviderClient(conn)}
	h.eventually("the metrics listener answers", func() error {
		_, err := http.Get(h.metrics + "/healthz")
		return err
	})
	return h
}

// eventually retries check for up to 20 seconds.
func (h *harness) eventually(what string, check func() error) {
	h.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *harness) admin(action string, q url.Values) {
	h.t.Helper()
	resp, err := http.Post(h.metrics+"/admin/"+action+"?"+q.Encode(), "", nil)
	if err != nil {
		h.t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		h.t.Fatalf("POST /admin/%s?%s: %s: %s", action, q.Encode(), resp.Status, body)
	}
}

func (h *harness) scrape() (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(h.metrics + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(resp.Body)
}

// value returns the sum of the samples of family name whose labels
// include want (a gauge's or counter's value).
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
	sum, found := 0.0, false
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			match = match && labels[k] == v
		}
		if !match {
			continue
		}
		found = true
		switch {
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		}
	}
	return sum, found
}

// metricAtLeast waits until the metric's value is >= min.
func (h *harness) metricAtLeast(name string, labels map[string]string, min float64) {
	h.t.Helper()
	h.eventually(fmt.Sprintf("%s%v >= %v", name, labels, min), func() error {
		fams, err := h.scrape()
		if err != nil {
			return err
		}
		v, ok := value(fams, name, labels)
		if !ok || v < min {
			return fmt.Errorf("value %v (present %t)", v, ok)
		}
		return nil
	})
}

func (h *harness) metricEquals(name string, labels map[string]string, want float64) {
	h.t.Helper()
	h.eventually(fmt.Sprintf("%s%v == %v", name, labels, want), func() error {
		fams, err := h.scrape()
		if err != nil {
			return err
		}
		if v, ok := value(fams, name, labels); !ok || v != want {
			return fmt.Errorf("value %v (present %t)", v, ok)
		}
		return nil
	})
}

func (h *harness) state(id string) (*pb.Machine, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return h.client.Get(ctx, &pb.MachineRef{Id: id})
}

// waitState waits until machine id is in want; a machine not there yet
// (an orphan before its adoption) is waited for too.
func (h *harness) waitState(id string, want pb.MachineState) *pb.Machine {
	h.t.Helper()
	return providertest.WaitFor(h.t, func() *pb.Machine {
		m, err := h.state(id)
		if err != nil {
			return &pb.Machine{Id: id, LastError: err.Error()}
		}
		return m
	}, id, want, 20*time.Second)
}

func (h *harness) create(id string) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := h.client.Create(ctx, &pb.CreateRequest{MachineId: id}); err != nil {
		h.t.Fatalf("Create %s: %v", id, err)
	}
}

// TestDriftMetrics drives a provider over gRPC, induces every drift kind
// through the simulator's /admin/ endpoints and checks the scraped
// metrics.
func TestDriftMetrics(t *testing.T) {
	h, cfg := start(t)
	m0, m1, m2 := cfg.Slots[0], cfg.Slots[1], cfg.Slots[2]
	for _, s := range []string{m0.ID, m1.ID} {
		h.create(s)
	}
	for _, s := range []string{m0.ID, m1.ID} {
		h.waitState(s, pb.MachineState_MACHINE_STATE_IDLE)
	}
	drift := func(zone, kind string) map[string]string { return map[string]string{"zone": zone, "kind": kind} }

	// Every kind is reported per zone, zeros included.
	h.admin("stop", url.Values{"machine": {m0.ID}})
	h.metricEquals("bigfleet_provider_drift", drift(m0.Zone, "stopped"), 1)
	h.metricEquals("bigfleet_provider_drift", drift(m0.Zone, "leaked"), 0)

	h.admin("pause", url.Values{"machine": {m1.ID}})
	h.metricEquals("bigfleet_provider_drift", drift(m1.Zone, "paused"), 1)

	h.admin("resize", url.Values{"machine": {m0.ID}, "vcpu": {"7"}, "memory_mib": {"7168"}})
	h.metricEquals("bigfleet_provider_drift", drift(m0.Zone, "resized"), 1)

	// A host that cannot be listed: unknown-host, zone_up 0.
	h.admin("unreachable", url.Values{"zone": {m2.Zone}})
	h.metricEquals("bigfleet_provider_drift", drift(m2.Zone, "unknown-host"), 1)
	h.metricEquals("bigfleet_provider_zone_up", map[string]string{"zone": m2.Zone}, 0)

	// A foreign domain takes the name m2's VM will get; m2 is created
	// while its host is unreachable (so it waits), then the host returns.
	h.admin("add-foreign", url.Values{"zone": {m2.Zone}, "name": {naming.VMName("mt", m2.ID, 1)}})
	h.create(m2.ID)
	h.admin("unreachable", url.Values{"zone": {m2.Zone}, "on": {"false"}})
	h.metricEquals("bigfleet_provider_zone_up", map[string]string{"zone": m2.Zone}, 1)
	h.metricEquals("bigfleet_provider_drift", drift(m2.Zone, "unmanaged-name-collision"), 1)
	got := h.waitState(m2.ID, pb.MachineState_MACHINE_STATE_FAILED)
	if !strings.Contains(got.GetLastError(), "taken by a domain this provider does not own") {
		t.Errorf("%s last_error %q", m2.ID, got.GetLastError())
	}

	// The VM of an IDLE machine vanishes: missing, machine FAILED.
	h.admin("delete", url.Values{"machine": {m1.ID}})
	h.metricEquals("bigfleet_provider_drift", drift(m1.Zone, "missing"), 1)
	got = h.waitState(m1.ID, pb.MachineState_MACHINE_STATE_FAILED)
	if !strings.Contains(got.GetLastError(), "vanished out of band") {
		t.Errorf("%s last_error %q", m1.ID, got.GetLastError())
	}

	// An owned VM no machine claims: orphan, adopted as slotless.
	h.admin("add-owned", url.Values{"zone": {m0.Zone}, "name": {"bf-mt-orphan-1-c1"}, "id": {"orphan-1"}, "instance_type": {m0.Type.Name}})
	h.metricEquals("bigfleet_provider_drift", drift(m0.Zone, "orphan"), 1)
	h.waitState("orphan-1", pb.MachineState_MACHINE_STATE_IDLE)

	// The rest of the families.
	h.metricAtLeast("bigfleet_provider_machines", map[string]string{"state": "IDLE", "zone": m0.Zone}, 1)
	h.metricAtLeast("bigfleet_provider_machines", map[string]string{"state": "FAILED"}, 2)
	h.metricAtLeast("bigfleet_provider_machines", map[string]string{"state": "SPECULATIVE"}, 1)
	h.metricAtLeast("bigfleet_provider_hypervisor_calls_total", map[string]string{"op": "define_domain", "outcome": "ok"}, 2)
	h.metricAtLeast("bigfleet_provider_hypervisor_calls_total", map[string]string{"op": "observe", "outcome": "error"}, 1)
	rpc := func(method, code string) map[string]string {
		return map[string]string{"grpc_type": "unary", "grpc_service": "bigfleet.v1alpha1.CapacityProvider", "grpc_method": method, "grpc_code": code}
	}
	h.metricAtLeast("grpc_server_handled_total", rpc("Create", "OK"), 3)
	h.metricAtLeast("grpc_server_handled_total", rpc("Get", "OK"), 1)
	h.metricAtLeast("grpc_server_started_total", map[string]string{"grpc_method": "Create"}, 3)
	// Every method is initialised at zero before its first call.
	h.metricEquals("grpc_server_handled_total", rpc("Configure", "Unavailable"), 0)
	h.metricEquals("bigfleet_provider_state_healthy", nil, 1)
	h.metricEquals("bigfleet_provider_reconcile_interval_seconds", nil, 0)
	h.metricEquals("bigfleet_provider_build_info", map[string]string{"goversion": runtime.Version()}, 1)
	h.metricAtLeast("bigfleet_provider_executor_steps_total", map[string]string{"action": "define", "outcome": "ok"}, 2)
	h.metricAtLeast("bigfleet_provider_executor_steps_total", map[string]string{"action": "start"}, 2)
	h.metricAtLeast("bigfleet_provider_state_commits_total", nil, 1)
	h.metricAtLeast("bigfleet_provider_state_records_total", nil, 1)

	fams, err := h.scrape()
	if err != nil {
		t.Fatal(err)
	}
	// Low-cardinality labels only: no machine id anywhere.
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				for _, id := range []string{m0.ID, m1.ID, m2.ID, "orphan-1"} {
					if l.GetValue() == id {
						t.Errorf("%s carries machine id %s in label %s", name, id, l.GetName())
					}
				}
			}
		}
	}
	if v, _ := value(fams, "bigfleet_provider_plan_last_timestamp_seconds", nil); v <= 0 {
		t.Errorf("plan_last_timestamp_seconds %v", v)
	}
}

// TestScrapeConsistency scrapes /metrics many times beside full passes
// (every 500ms) and /debug/plan reads (which used to republish the plan
// gauges), with three stopped VMs whose repair is held: every scrape must
// show exactly the same drift, pending-step and step counts (issue 18:
// 3,000 scrapes saw the series absent 450 times, at 0 1,130 times, at 1
// 1,338 times, at 2 82 times, from a Reset() then Inc()s).
func TestScrapeConsistency(t *testing.T) {
	addrs := providertest.FreeAddrs(t, 2)
	grpcAddr, metricsAddr := addrs[0], addrs[1]
	cfg, err := config.Parse(plugin.MustRegistry(libvirt.Plugin(), proxmox.Plugin()), []string{"--use-fake-backend", "--installation-id", "sc", "--seed-count", "12",
		"--state", filepath.Join(t.TempDir(), "state"), "--addr", grpcAddr, "--metrics-addr", metricsAddr,
		"--reconcile-interval", "500ms", "--drift-repair-delay", "1h", "--shutdown-grace", "2s", "--fake-admin"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	h := serve(t, cfg, grpcAddr, metricsAddr)
	var ids []string
	for _, s := range cfg.Slots {
		if s.Zone == cfg.Slots[0].Zone && len(ids) < 3 {
			ids = append(ids, s.ID)
		}
	}
	zone := cfg.Slots[0].Zone
	for _, id := range ids {
		h.create(id)
	}
	for _, id := range ids {
		h.waitState(id, pb.MachineState_MACHINE_STATE_IDLE)
		h.admin("stop", url.Values{"machine": {id}})
	}
	h.metricEquals("bigfleet_provider_drift", map[string]string{"zone": zone, "kind": "stopped"}, 3)

	stop := make(chan struct{})
	reads := make(chan int)
	go func() {
		n := 0
		defer func() { reads <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if resp, err := http.Get(h.metrics + "/debug/plan?max_age=0s"); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				n++
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	full := func(fams map[string]*dto.MetricFamily) float64 {
		v, _ := value(fams, "bigfleet_provider_reconciles_total", map[string]string{"outcome": "full"})
		return v
	}
	// BIGFLEET_SCRAPES raises the count for a measurement (the issue's
	// figure was 3,000 scrapes).
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("BIGFLEET_SCRAPES")); err == nil && v > 0 {
		n = v
	}
	var first, last float64
	bad := map[string]int{}
	for i := 0; i < n; i++ {
		fams, err := h.scrape()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, c := range []struct {
			name   string
			labels map[string]string
		}{
			{"bigfleet_provider_drift", map[string]string{"zone": zone, "kind": "stopped"}},
			{"bigfleet_provider_plan_pending_steps", map[string]string{"action": "start"}},
			{"bigfleet_provider_plan_steps", nil},
		} {
			v, ok := value(fams, c.name, c.labels)
			if !ok {
				bad[c.name+" absent"]++
				continue
			}
			if v != 3 {
				bad[fmt.Sprintf("%s at %v", c.name, v)]++
			}
			got[c.name] = v
		}
		if i == 0 {
			first = full(fams)
		}
		last = full(fams)
	}
	close(stop)
	r := <-reads
	t.Logf("%d scrapes beside %v full passes and %d /debug/plan reads: %d inconsistent %v", n, last-first, r, len(bad), bad)
	if len(bad) > 0 {
		t.Errorf("inconsistent scrapes: %v", bad)
	}
	if last-first < 2 {
		t.Errorf("only %v full passes ran beside the scrapes; the measurement needs passes", last-first)
	}
}
