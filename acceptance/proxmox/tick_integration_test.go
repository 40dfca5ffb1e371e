//go:build integration

package proxmox

import (
	"testing"
	"time"
)

// TestTickRequestsThroughBinaryAt1000 counts the API requests of the
// binary over 1,000 owned, running VMs it adopts at start (one
// SPECULATIVE slot per VM). The adapter's poller lists the cluster once
// per second (its default interval) and the reconcile ticks (3 s, longer
// than the 2 s listing TTL) reuse its listing: an unchanged fleet costs
// one listing per second and nothing else.
func TestTickRequestsThroughBinaryAt1000(t *testing.T) {
	const n, inst, interval, poll = 1000, "acc-tick", 3 * time.Second, time.Second
	c := newCluster(t, clusterOpts{})
	ownedFleet(t, c.sim, inst, n)
	p := c.start(t, launch{offerings: []offering{{"pve.small", "pve1", "on_demand", n / 2}, {"pve.small", "pve2", "on_demand", n / 2}},
		// The capacity check reads each node's status once per full pass
		// (--capacity-check, default warn); this test counts what the
		// observation of an unchanged fleet costs, so it is off here.
		args: []string{"--installation-id", inst, "--reconcile-interval", interval.String(), "--capacity-check", "off"}})
	eventually(t, "every VM adopted as IDLE", func() bool {
		return len(p.machines("pve1")) == 0 && len(p.machines("pve2")) == 0
	})
	time.Sleep(interval) // let adoption settle
	began := time.Now()
	before, lists := c.sim.RequestCount(""), c.sim.RequestCount("GET /cluster/resources")
	const ticks = 4
	time.Sleep(ticks * interval)
	total, listings := c.sim.RequestCount("")-before, c.sim.RequestCount("GET /cluster/resources")-lists
	polls := int(time.Since(began) / poll)
	t.Logf("through the binary, 1,000 owned VMs: %d requests over %d ticks (%d listings, %d poll intervals): %.1f requests/tick",
		total, ticks, listings, polls, float64(total)/ticks)
	if total != listings || listings > polls+2 {
		t.Errorf("%d requests (%d listings) over %d unchanged ticks, want only listings, about one per %s poll (%d)",
			total, listings, ticks, poll, polls)
	}
}
