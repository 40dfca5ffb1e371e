package proxmox

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvesim"
)

// TestReadCapacity reads a node's size and the target storage over
// go-proxmox from the simulator, configured with a non-default host.
func TestReadCapacity(t *testing.T) {
	host := pvesim.HostCapacity{MemoryBytes: 48 << 30, CPUs: 12, StorageBytes: 2 << 40, StorageFreeBytes: 300 << 30}
	e := newEnv(t, &pvesim.Options{Nodes: []string{"pve1", "pve2", "pve3"}, Latencies: pvesim.ZeroLatency(), Host: host},
		func(c *Config) { c.Storage = "local-lvm" })
	cr, ok := hypervisors.Find[hypervisors.CapacityReader](e.a)
	if !ok {
		t.Fatal("the Proxmox adapter does not offer CapacityReader")
	}
	got, err := cr.ReadCapacity(ctxT(t, 10*time.Second), "pve2")
	if err != nil {
		t.Fatal(err)
	}
	want := hypervisors.HostCapacity{MemoryBytes: 48 << 30, CPUs: 12, DiskBytes: 2 << 40, DiskFreeBytes: 300 << 30, StorageName: "local-lvm"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("capacity (-want +got):\n%s", diff)
	}
	if _, err := cr.ReadCapacity(ctxT(t, 10*time.Second), "pve9"); !errors.Is(err, hypervisors.ErrInvalid) {
		t.Errorf("unknown node: %v, want ErrInvalid", err)
	}
}

// TestReadCapacityNoStorage: without a target storage only the node is
// read; a storage that does not exist is an error naming it.
func TestReadCapacityNoStorage(t *testing.T) {
	e := newEnv(t, nil, nil)
	got, err := e.a.ReadCapacity(ctxT(t, 10*time.Second), "pve1")
	if err != nil {
		t.Fatal(err)
	}
	if got.MemoryBytes != 64<<30 || got.CPUs != 16 || got.DiskBytes != 0 {
		t.Errorf("capacity %+v, want the default node (64 GiB, 16 CPUs) and no storage", got)
	}
	e = newEnv(t, nil, func(c *Config) { c.Storage = "ceph" })
	if _, err := e.a.ReadCapacity(ctxT(t, 10*time.Second), "pve1"); err == nil || !strings.Contains(err.Error(), "storage ceph") {
		t.Errorf("missing storage: %v, want an error naming it", err)
	}
}
