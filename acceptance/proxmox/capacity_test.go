package proxmox

import (
	"context"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvesim"
	"github.com/bigfleet-vm/provider/internal/providertest"
	"github.com/bigfleet-vm/provider/jsonplan"
)

// TestStorageCapacity: with no target storage configured, the binary
// reads the storage holding the template's disks (a shared ceph here)
// through each node: `provider plan` shows its figures, a clone's disk
// shows in the next reading, and a Create the storage cannot hold fails
// with the storage and its free space in last_error, not the raw
// qemu-img message.
func TestStorageCapacity(t *testing.T) {
	t.Parallel()
	const gib = 1 << 30
	c := newCluster(t, clusterOpts{templateStorage: "ceph",
		storages: []pvesim.Storage{{Name: "ceph", Shared: true, Bytes: 64 * gib, FreeBytes: 12 * gib}}})
	p := c.start(t, launch{offerings: []offering{{"pve.small", "pve1", "on_demand", 2}, {"pve.small", "pve2", "on_demand", 1}}})

	disk := func(free uint64) *jsonplan.Disk {
		return &jsonplan.Disk{Storage: "ceph", TotalBytes: 64 * gib, FreeBytes: free}
	}
	waitDisk(t, p, "pve2", disk(12*gib))
	out, err := exec.Command(binary, append([]string{"plan", "--no-color"}, p.Argv()[1:]...)...).CombinedOutput()
	if err != nil || !regexp.MustCompile(`pve1 .*\n(?:.*\n)*?\s+disk\s+ceph: 12\.0 GiB free of 64\.0 GiB`).Match(out) {
		t.Errorf("offline text plan (%v) lacks the template storage's figures:\n%s", err, out)
	}

	ids := p.machines("pve1")
	if len(ids) != 2 {
		t.Fatalf("have %d machines on pve1, want 2", len(ids))
	}
	p.toIdle(ids[0])
	// 8 GiB taken by the clone, on the one pool both nodes see.
	waitDisk(t, p, "pve2", disk(12*gib-pvesim.CloneDiskBytes))
	waitDisk(t, p, "pve1", disk(12*gib-pvesim.CloneDiskBytes))

	p.create(ids[1])
	m := p.wait(ids[1], providertest.StFailed)
	want := "create failed: storage pool space: zone pve1 pool ceph had 4096 MiB free at its newest reading; the hypervisor refused: "
	if !strings.HasPrefix(m.GetLastError(), want) || !strings.Contains(m.GetLastError(), "No space left on device") {
		t.Errorf("last_error %q, want it to start %q and carry the refusal", m.GetLastError(), want)
	}
	if n := len(c.clones()); n != 1 {
		t.Errorf("%d clones after the refused Create, want the first only", n)
	}
}

// waitDisk polls /debug/plan until zone's storage reads as want.
func waitDisk(t *testing.T, p *provider, zone string, want *jsonplan.Disk) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), pollTimeout)
	defer cancel()
	var got *jsonplan.Disk
	for {
		st, body := p.HTTPGet("/debug/plan")
		if st == http.StatusOK {
			pl, err := jsonplan.Decode([]byte(body))
			if err != nil {
				t.Fatalf("/debug/plan: %v", err)
			}
			for _, z := range capacityZones(pl) {
				if z.Zone == zone && z.Host != nil {
					got = z.Host.Disk
				}
			}
			if got != nil && *got == *want {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("zone %s's storage reads %+v, want %+v (%d %s)", zone, got, want, st, body)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// capacityZones is the plan's capacity section's zones (none before it has one).
func capacityZones(pl *jsonplan.Plan) []jsonplan.ZoneCapacity {
	if pl.Capacity == nil {
		return nil
	}
	return pl.Capacity.Zones
}
