package proxmox

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvemarker"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvesim"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvespec"
	"github.com/bigfleet-vm/provider/naming"
)

// fleet fills a simulator with n owned VMs spread over the three nodes.
func fleet(t testing.TB, e *env, n int) {
	t.Helper()
	for i := range n {
		m := marker(fmt.Sprintf("m-%04d", i))
		err := e.sim.AddVM(pvesim.VMSpec{VMID: 1000 + i, Node: []string{"pve1", "pve2", "pve3"}[i%3],
			Name: naming.VMName(testInst, m.MachineID, 1), Tags: pvemarker.Tags(m), Description: pvemarker.Description(m),
			Running: i%2 == 0, Cores: 2, MemoryMiB: 2048})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// observeTick observes every zone once, as one reconcile tick does.
func observeTick(t testing.TB, a *Adapter) int {
	owned := 0
	for _, z := range a.Zones() {
		obs, err := a.Observe(ctxT(t, 30*time.Second), z)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range obs.VMs {
			if v.Marker != nil {
				owned++
			}
		}
	}
	return owned
}

// TestObserveCallsAt1000 pins the API cost of observation: the first tick
// reads every owned VM's config once, later ticks of an unchanged fleet
// cost one listing, and a changed VM costs one more read.
func TestObserveCallsAt1000(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	e := newEnv(t, nil, func(c *Config) { c.Now = clock })
	fleet(t, e, 1000)
	tick := func() (calls int64, owned int) {
		mu.Lock()
		now = now.Add(30 * time.Second) // reconcile interval > ListingTTL
		mu.Unlock()
		before := e.a.Calls()
		owned = observeTick(t, e.a)
		return e.a.Calls() - before, owned
	}
	c1, o1 := tick()
	c2, o2 := tick()
	m := marker("m-0001")
	m.Cluster = "bound"
	if err := e.a.SetMarker(ctxT(t, 5*time.Second), hypervisors.Target{Zone: "pve2", VMID: 1001}, m); err != nil {
		t.Fatal(err)
	}
	c3, _ := tick()
	t.Logf("1,000 owned VMs on 3 nodes: first tick %d calls, unchanged tick %d calls, tick after one change %d calls", c1, c2, c3)
	if o1 != 1000 || o2 != 1000 {
		t.Errorf("owned VMs observed = %d, %d; want 1000", o1, o2)
	}
	if c1 != 1001 || c2 != 1 || c3 != 2 {
		t.Errorf("calls per tick = %d, %d, %d; want 1001, 1, 2", c1, c2, c3)
	}
}

// BenchmarkObserveTick1000 measures one steady-state tick over 3 zones
// with 1,000 owned VMs and reports API calls per tick.
func BenchmarkObserveTick1000(b *testing.B) {
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	e := newEnv(b, nil, func(c *Config) { c.Now = clock })
	fleet(b, e, 1000)
	observeTick(b, e.a) // warm the config cache
	b.ResetTimer()
	before := e.a.Calls()
	for range b.N {
		now = now.Add(30 * time.Second)
		observeTick(b, e.a)
	}
	b.ReportMetric(float64(e.a.Calls()-before)/float64(b.N), "calls/tick")
}

// BenchmarkCloneToAgentReady measures clone → configure → start → first
// successful agent ping with the simulator's default task latencies (run
// with -benchtime=1x; about 4.5 s per op).
func BenchmarkCloneToAgentReady(b *testing.B) {
	o := pvesim.Options{Nodes: []string{"pve1", "pve2", "pve3"}}
	e := newEnv(b, &o, func(c *Config) { c.PollMin, c.PollMax = 100*time.Millisecond, 2*time.Second })
	for i := range b.N {
		ctx := ctxT(b, time.Minute)
		start := time.Now()
		calls := e.a.Calls()
		mid := fmt.Sprintf("b-%d", i)
		id, err := e.a.CloneVM(ctx, "pve1", cloneSpec(mid))
		if err != nil {
			b.Fatal(err)
		}
		tg := hypervisors.Target{Zone: "pve1", VMID: id}
		if err := e.a.ConfigureVM(ctx, tg, pvespec.SizeSpec{VCPU: 2, MemoryMiB: 2048, Marker: marker(mid)}); err != nil {
			b.Fatal(err)
		}
		if err := e.a.Start(ctx, tg); err != nil {
			b.Fatal(err)
		}
		if _, err := waitAgent(ctx, e.a, tg); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(time.Since(start).Seconds(), "s-to-agent")
		b.ReportMetric(float64(e.a.Calls()-calls), "calls")
	}
}
