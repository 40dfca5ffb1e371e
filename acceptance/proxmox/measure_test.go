package proxmox

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvemarker"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvesim"
	"github.com/bigfleet-vm/provider/naming"
	"github.com/bigfleet-vm/provider/observed"
)

// ownedFleet adds n VMs owned by installation, alternating pve1 and pve2.
func ownedFleet(t testing.TB, s *pvesim.Server, installation string, n int) {
	t.Helper()
	for i := range n {
		m := observed.Marker{Installation: installation, MachineID: fmt.Sprintf("pve%d/pve.small/%03d", i%2+1, i/2),
			OpID: "op-1", InstanceType: "pve.small"}
		err := s.AddVM(pvesim.VMSpec{VMID: 1000 + i, Node: fmt.Sprintf("pve%d", i%2+1), Name: naming.VMName(installation, m.MachineID, 1),
			Tags: pvemarker.Tags(m), Description: pvemarker.Description(m), Pool: poolName,
			Cores: 2, MemoryMiB: 4096, Running: true, OnBoot: true})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestObserveRequestsAt1000 counts, on the simulator's side, the API
// requests of one reconcile tick (one Observe per node, as the reconciler
// does) over 1,000 owned VMs: the first tick reads every owned config
// once, an unchanged tick costs one /cluster/resources listing, and a tick
// after one VM changed costs one more config read. The poller is off: its
// requests run on their own clock (one listing per PollInterval, which
// Observe then reuses) and would land inside the ticks counted here; the
// adapter's own tests count them.
func TestObserveRequestsAt1000(t *testing.T) {
	t.Parallel()
	const n, inst = 1000, "acc-measure"
	c := newCluster(t, clusterOpts{setup: func(s *pvesim.Server) { ownedFleet(t, s, inst, n) }})
	now := time.Unix(1_800_000_000, 0)
	var mu sync.Mutex
	a, err := proxmox.New(proxmox.Config{APIURL: c.url, TokenID: tokenID, TokenSecret: c.secret, Fingerprint: c.fp,
		Pool: poolName, Nodes: []string{"pve1", "pve2"}, Installation: inst, PollInterval: -1,
		Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	tick := func() (requests, owned int) {
		mu.Lock()
		now = now.Add(time.Minute) // a reconcile interval longer than the listing TTL
		mu.Unlock()
		before := c.sim.RequestCount("")
		for _, z := range a.Zones() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			obs, err := a.Observe(ctx, z)
			cancel()
			if err != nil {
				t.Fatalf("observe %s: %v", z, err)
			}
			for _, v := range obs.VMs {
				if v.Marker != nil {
					owned++
				}
			}
		}
		return c.sim.RequestCount("") - before, owned
	}
	cold, o1 := tick()
	steady, o2 := tick()
	m := observed.Marker{Installation: inst, MachineID: "pve2/pve.small/000", OpID: "op-1", InstanceType: "pve.small", Cluster: "bound"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.SetMarker(ctx, hypervisors.Target{Zone: "pve2", VMID: 1001}, m); err != nil {
		t.Fatal(err)
	}
	changed, _ := tick()
	listings := c.sim.RequestCount("GET /cluster/resources")
	t.Logf("1,000 owned VMs on 2 nodes, requests per tick: cold %d, unchanged %d, after one change %d (%d listings in total)", cold, steady, changed, listings)
	if o1 != n || o2 != n {
		t.Errorf("owned VMs observed = %d, %d; want %d", o1, o2, n)
	}
	if cold != n+1 || steady != 1 || changed != 2 {
		t.Errorf("requests per tick = %d, %d, %d; want %d, 1, 2", cold, steady, changed, n+1)
	}
}

// BenchmarkCreateToIdleDefaultLatency measures Create → IDLE through the
// binary against the simulator with pvesim.DefaultLatencies() (clone 2 s,
// start 1 s, agent boot 1.5 s). Run with -benchtime=3x:
//
//	go test -run '^$' -bench CreateToIdle -benchtime 3x ./acceptance/proxmox/
func BenchmarkCreateToIdleDefaultLatency(b *testing.B) {
	c := newCluster(b, clusterOpts{latencies: pvesim.DefaultLatencies()})
	p := c.start(b, launch{offerings: []offering{{"pve.small", "pve1", "on_demand", b.N}}})
	ids := p.machines("pve1")
	b.ResetTimer()
	var total time.Duration
	before := c.sim.RequestCount("")
	for i := range b.N {
		began := time.Now()
		p.toIdle(ids[i])
		total += time.Since(began)
	}
	b.ReportMetric(total.Seconds()/float64(b.N), "s-create-to-idle")
	b.ReportMetric(float64(c.sim.RequestCount("")-before)/float64(b.N), "requests/create")
}
