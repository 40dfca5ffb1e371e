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
// one listing per second, plus, for the capacity check, one status read
// per node and full pass and one read of the template's storage per node
// and pass (the template's config, where that storage is named, is kept
// 10 minutes: at most one read here), and nothing else.
func TestTickRequestsThroughBinaryAt1000(t *testing.T) {
	const n, inst, interval, poll = 1000, "acc-tick", 3 * time.Second, time.Second
	c := newCluster(t, clusterOpts{})
	ownedFleet(t, c.sim, inst, n)
	p := c.start(t, launch{offerings: []offering{{"pve.small", "pve1", "on_demand", n / 2}, {"pve.small", "pve2", "on_demand", n / 2}},
		args: []string{"--installation-id", inst, "--reconcile-interval", interval.String()}})
	eventually(t, "every VM adopted as IDLE", func() bool {
		return len(p.machines("pve1")) == 0 && len(p.machines("pve2")) == 0
	})
	time.Sleep(interval) // let adoption settle
	began := time.Now()
	// The capacity check (--capacity-check, default warn) reads each
	// node's status and the template's storage once per full pass: no
	// other request is allowed but the template's config, at most once.
	capacityReads := func() int {
		return c.sim.RequestCount("GET /nodes/pve1/status") + c.sim.RequestCount("GET /nodes/pve2/status") +
			c.sim.RequestCount("GET /nodes/pve1/storage/local-lvm/status") + c.sim.RequestCount("GET /nodes/pve2/storage/local-lvm/status")
	}
	configReads := func() int { return c.sim.RequestCount("GET /nodes/pve1/qemu/9000/config") }
	before, lists, reads, configs := c.sim.RequestCount(""), c.sim.RequestCount("GET /cluster/resources"), capacityReads(), configReads()
	const ticks = 4
	time.Sleep(ticks * interval)
	total, listings, capacity, config := c.sim.RequestCount("")-before, c.sim.RequestCount("GET /cluster/resources")-lists, capacityReads()-reads, configReads()-configs
	polls := int(time.Since(began) / poll)
	t.Logf("through the binary, 1,000 owned VMs: %d requests over %d ticks (%d listings, %d capacity reads, %d template config reads, %d poll intervals): %.1f requests/tick",
		total, ticks, listings, capacity, config, polls, float64(total)/ticks)
	if total != listings+capacity+config || listings > polls+2 || config > 1 {
		t.Errorf("%d requests (%d listings, %d capacity reads, %d template config reads) over %d unchanged ticks, want only listings, about one per %s poll (%d), capacity reads and at most one config read",
			total, listings, capacity, config, ticks, poll, polls)
	}
	if passes := ticks + 1; capacity > 4*passes {
		t.Errorf("%d capacity reads over %d full passes of 2 nodes, want at most two per node and pass", capacity, passes)
	}
}
