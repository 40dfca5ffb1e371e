//go:build integration

package proxmox

import (
	"testing"
	"time"
)

// TestTickRequestsThroughBinaryAt1000 counts the API requests of the
// binary's reconcile ticks over 1,000 owned, running VMs it adopts at
// start (one SPECULATIVE slot per VM). The interval (3 s) exceeds the
// adapter's 2 s listing TTL, so every tick lists once.
func TestTickRequestsThroughBinaryAt1000(t *testing.T) {
	const n, inst, interval = 1000, "acc-tick", 3 * time.Second
	c := newCluster(t, clusterOpts{})
	ownedFleet(t, c.sim, inst, n)
	p := c.start(t, launch{offerings: []offering{{"pve.small", "pve1", "on_demand", n / 2}, {"pve.small", "pve2", "on_demand", n / 2}},
		args: []string{"--installation-id", inst, "--reconcile-interval", interval.String()}})
	eventually(t, "every VM adopted as IDLE", func() bool {
		return len(p.machines("pve1")) == 0 && len(p.machines("pve2")) == 0
	})
	time.Sleep(interval) // let adoption settle
	before, configs := c.sim.RequestCount(""), c.sim.RequestCount("GET /cluster/resources")
	const ticks = 4
	time.Sleep(ticks * interval)
	total, listings := c.sim.RequestCount("")-before, c.sim.RequestCount("GET /cluster/resources")-configs
	t.Logf("through the binary, 1,000 owned VMs: %d requests over %d ticks (%d listings): %.1f requests/tick",
		total, ticks, listings, float64(total)/ticks)
	if total > 2*ticks {
		t.Errorf("%d requests over %d unchanged ticks, want about one listing per tick", total, ticks)
	}
}
