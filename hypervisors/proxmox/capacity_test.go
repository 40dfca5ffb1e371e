package proxmox

import (
	"errors"
	"slices"
	"strings"
	"sync"
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

// TestReadCapacityNoStorage: without a target storage or a template only the node is
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

// templateWorld is a cluster whose two templates keep their disks on
// three storages: template 9000 on local-lvm (900 GiB free of 1 TiB, the
// default), template 9001 on pve2 on the shared ceph (200 GiB free of 4
// TiB) with its EFI disk on the local nvme (500 GiB free of 2 TiB), plus
// drives that are no disks of a clone: a cloud-init CD-ROM and an ISO on
// storages that do not exist, an empty CD drive and a passed-through
// device. Reading either of those fails the read.
func templateWorld(t *testing.T, mut func(*Config)) *env {
	t.Helper()
	o := &pvesim.Options{Nodes: []string{"pve1", "pve2", "pve3"}, Latencies: pvesim.ZeroLatency(),
		Storages: []pvesim.Storage{
			{Name: "ceph", Shared: true, Bytes: 4 << 40, FreeBytes: 200 << 30},
			{Name: "nvme", Bytes: 2 << 40, FreeBytes: 500 << 30},
		}}
	e := newEnv(t, o, func(c *Config) {
		c.Templates = []int{template, 9001}
		if mut != nil {
			mut(c)
		}
	})
	if err := e.sim.AddVM(pvesim.VMSpec{VMID: 9001, Node: "pve2", Name: "gpu-tmpl", Template: true, Storage: "ceph",
		Drives: map[string]string{
			"efidisk0": "nvme:vm-9001-disk-1,efitype=4m,size=4M",
			"ide2":     "cloudinit-store:vm-9001-cloudinit,media=cdrom",
			"ide0":     "iso-store:iso/debian.iso,media=cdrom,size=600M",
			"sata1":    "none,media=cdrom",
			"virtio3":  "/dev/disk/by-id/nvme-spare,size=100G",
		}}); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestReadCapacityTemplateStorage: with no Config.Storage the target
// storage is where the templates' disks are (a full clone without a
// target storage lands there); of several, the one with the least free
// space is reported, read through the zone's node even when shared.
func TestReadCapacityTemplateStorage(t *testing.T) {
	e := templateWorld(t, nil)
	got, err := e.a.ReadCapacity(ctxT(t, 10*time.Second), "pve3")
	if err != nil {
		t.Fatal(err)
	}
	want := hypervisors.HostCapacity{MemoryBytes: 64 << 30, CPUs: 16, DiskBytes: 4 << 40, DiskFreeBytes: 200 << 30, StorageName: "ceph"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("capacity (-want +got):\n%s", diff)
	}
	for _, st := range []string{"ceph", "local-lvm", "nvme"} {
		if n := e.sim.RequestCount("GET /nodes/pve3/storage/" + st + "/status"); n != 1 {
			t.Errorf("storage %s read %d times through pve3, want once", st, n)
		}
	}

	// One template on local-lvm: its figures.
	e = newEnv(t, nil, func(c *Config) { c.Templates = []int{template} })
	got, err = e.a.ReadCapacity(ctxT(t, 10*time.Second), "pve1")
	if err != nil {
		t.Fatal(err)
	}
	want = hypervisors.HostCapacity{MemoryBytes: 64 << 30, CPUs: 16, DiskBytes: 1 << 40, DiskFreeBytes: 900 << 30, StorageName: "local-lvm"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("one template on local-lvm: capacity (-want +got):\n%s", diff)
	}

	// A clone consumes the storage: the next read shows it.
	if _, err := e.a.CloneVM(ctxT(t, 10*time.Second), "pve1", cloneSpec("m-1")); err != nil {
		t.Fatal(err)
	}
	got, err = e.a.ReadCapacity(ctxT(t, 10*time.Second), "pve1")
	if err != nil {
		t.Fatal(err)
	}
	if got.DiskFreeBytes != 900<<30-pvesim.CloneDiskBytes {
		t.Errorf("free after one clone = %d, want %d", got.DiskFreeBytes, uint64(900<<30-pvesim.CloneDiskBytes))
	}

	// A template that is gone: the read fails naming it.
	e = newEnv(t, nil, func(c *Config) { c.Templates = []int{template, 7777} })
	if _, err := e.a.ReadCapacity(ctxT(t, 10*time.Second), "pve1"); !errors.Is(err, hypervisors.ErrNotFound) || !strings.Contains(err.Error(), "template 7777") {
		t.Errorf("missing template: %v, want ErrNotFound naming it", err)
	}
}

// TestTemplateStoragesCached: the templates' storages are read once per
// ConfigTTL whatever the number of reads and zones, then again.
func TestTemplateStoragesCached(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	e := templateWorld(t, func(c *Config) {
		c.ConfigTTL = 10 * time.Minute
		c.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	})
	read := func() {
		t.Helper()
		var wg sync.WaitGroup
		for _, z := range []string{"pve1", "pve2", "pve3"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := e.a.ReadCapacity(ctxT(t, 10*time.Second), z); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
	}
	configs := func() int {
		return e.sim.RequestCount("GET /nodes/pve1/qemu/9000/config") + e.sim.RequestCount("GET /nodes/pve2/qemu/9001/config")
	}
	for range 3 {
		read()
	}
	if n := configs(); n != 2 {
		t.Errorf("3 passes of 3 zones read the 2 templates' configs %d times, want once each", n)
	}
	mu.Lock()
	now = now.Add(10 * time.Minute)
	mu.Unlock()
	read()
	if n := configs(); n != 4 {
		t.Errorf("after ConfigTTL the templates' configs were read %d times in all, want twice each", n)
	}
}

// TestReadCapacityBounded: a template config or storage status request
// that hangs ends at HTTPTimeout, failing the read, not the caller's
// deadline.
func TestReadCapacityBounded(t *testing.T) {
	for _, path := range []string{"/qemu/9000/config", "/storage/local-lvm/status"} {
		t.Run(path, func(t *testing.T) {
			e := newEnv(t, nil, func(c *Config) { c.Templates = []int{template}; c.HTTPTimeout = 200 * time.Millisecond })
			e.sim.InjectDelay(pvesim.Match{Path: path}, -1, time.Minute)
			ctx := ctxT(t, 30*time.Second)
			_, err := e.a.ReadCapacity(ctx, "pve1")
			if err == nil || ctx.Err() != nil {
				t.Fatalf("ReadCapacity = %v (ctx %v), want a failure at HTTPTimeout before the caller's deadline", err, ctx.Err())
			}
		})
	}
}

// TestDiskStorages reads the storages of a config's disks.
func TestDiskStorages(t *testing.T) {
	conf := map[string]any{
		"scsi0": "local-lvm:vm-9000-disk-0,size=8G", "virtio1": "file=ceph:vm-9000-disk-1,size=1G",
		"sata2": "nfs:9000/vm-9000-disk-2.qcow2,size=2G", "efidisk0": "nvme:vm-9000-disk-3,size=4M",
		"tpmstate0": "zfs:vm-9000-disk-4,size=4M,version=v2.0",
		"ide2":      "local-lvm:vm-9000-cloudinit,media=cdrom", "ide0": "none,media=cdrom", "ide1": "cdrom,media=cdrom",
		"scsi5": "/dev/sdb", "unused0": "other:vm-9000-disk-9", "scsihw": "virtio-scsi-single", "cores": 2, "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0",
	}
	got := diskStorages(conf)
	slices.Sort(got)
	if diff := cmp.Diff([]string{"ceph", "local-lvm", "nfs", "nvme", "zfs"}, got); diff != "" {
		t.Errorf("disk storages (-want +got):\n%s", diff)
	}
}

// TestReadCapacityNamesMissingPrivilege: a token without Datastore.Audit
// (which the preflight does not require) gets an unknown capacity whose
// error names the path and privilege, classed as a permission error.
func TestReadCapacityNamesMissingPrivilege(t *testing.T) {
	e := newEnv(t, nil, func(c *Config) { c.Templates = []int{template} })
	e.sim.Revoke(testToken, "/", "Datastore.Audit")
	_, err := e.a.ReadCapacity(ctxT(t, 10*time.Second), "pve1")
	if !errors.Is(err, hypervisors.ErrPermission) || !strings.Contains(err.Error(), "/storage/local-lvm, Datastore.Audit") {
		t.Errorf("ReadCapacity without Datastore.Audit = %v, want a permission error naming it", err)
	}
}
