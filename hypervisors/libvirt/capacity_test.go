package libvirt

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/hypervisors"
)

// Procedures of the capacity read (go-libvirt's constants are internal).
const (
	procNodeGetInfo               = 6
	procStoragePoolLookup         = 84
	procStoragePoolGetInfo        = 87
	errNoStoragePoolCode          = 49
	testNodeMemKiB                = 64 * 1024 * 1024 // 64 GiB
	testNodeCPUs                  = 16
	testPoolCapacity       uint64 = 500 << 30
	testPoolAvail          uint64 = 120 << 30
)

// nodeInfoReply encodes NodeGetInfo's reply: model char[32] (XDR: one
// 4-byte int each), memory KiB, cpus, mhz, nodes, sockets, cores, threads.
func nodeInfoReply(memKiB uint64, cpus int32) []byte {
	b := make([]byte, 32*4)
	b = binary.BigEndian.AppendUint64(b, memKiB)
	for _, v := range []int32{cpus, 2000, 1, 1, cpus, 1} {
		b = binary.BigEndian.AppendUint32(b, uint32(v))
	}
	return b
}

// poolReply encodes a StoragePool (name, zero UUID) as a lookup returns it.
func poolReply(name string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(name)))
	b = append(b, name...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return append(b, make([]byte, 16)...)
}

// poolInfoReply encodes StoragePoolGetInfo's reply: state, capacity,
// allocation, available.
func poolInfoReply(capacity, avail uint64) []byte {
	b := binary.BigEndian.AppendUint32(nil, 2) // running
	b = binary.BigEndian.AppendUint64(b, capacity)
	b = binary.BigEndian.AppendUint64(b, capacity-avail)
	return binary.BigEndian.AppendUint64(b, avail)
}

// TestReadCapacity reads a host's capacity over go-libvirt from a daemon
// that answers the node and pool info calls with known figures, and
// checks the units (libvirt's memory is KiB) and the pool asked for.
func TestReadCapacity(t *testing.T) {
	d := newFakeDaemon(t)
	var asked string
	d.answer(procNodeGetInfo, func(int) (uint32, []byte, bool) { return 0, nodeInfoReply(testNodeMemKiB, testNodeCPUs), true })
	d.answer(procStoragePoolLookup, func(int) (uint32, []byte, bool) { return 0, poolReply("default"), true })
	d.answer(procStoragePoolGetInfo, func(int) (uint32, []byte, bool) {
		asked = "default"
		return 0, poolInfoReply(testPoolCapacity, testPoolAvail), true
	})
	h := newFakeZone(t, d, 0, 0)
	h.cfg.Pool = "default" // before any call
	cr, ok := hypervisors.Find[hypervisors.CapacityReader](h)
	if !ok {
		t.Fatal("the libvirt adapter does not offer CapacityReader")
	}
	got, err := cr.ReadCapacity(context.Background(), "z")
	if err != nil {
		t.Fatal(err)
	}
	want := hypervisors.HostCapacity{MemoryBytes: 64 << 30, CPUs: testNodeCPUs, DiskBytes: testPoolCapacity, DiskFreeBytes: testPoolAvail, StorageName: "default"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("capacity (-want +got):\n%s", diff)
	}
	if asked != "default" {
		t.Errorf("pool info not read")
	}
	if _, err := cr.ReadCapacity(context.Background(), "nope"); !errors.Is(err, hypervisors.ErrInvalid) {
		t.Errorf("unknown zone: %v, want ErrInvalid", err)
	}
}

// TestReadCapacityMissingPool: a zone whose pool is gone has no capacity
// reading, and the error names the zone.
func TestReadCapacityMissingPool(t *testing.T) {
	d := newFakeDaemon(t)
	d.answer(procNodeGetInfo, func(int) (uint32, []byte, bool) { return 0, nodeInfoReply(testNodeMemKiB, testNodeCPUs), true })
	d.answer(procStoragePoolLookup, func(int) (uint32, []byte, bool) {
		return 1, libvirtError(errNoStoragePoolCode, "Storage pool not found"), true
	})
	h := newFakeZone(t, d, 0, 0)
	h.cfg.Pool = "gone"
	_, err := h.ReadCapacity(context.Background(), "z")
	if err == nil || !strings.Contains(err.Error(), "read capacity of z") {
		t.Fatalf("missing pool: %v, want an error naming the zone", err)
	}
}
