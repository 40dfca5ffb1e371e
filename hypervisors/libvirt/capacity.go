package libvirt

import (
	"context"
	"fmt"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/bigfleet-vm/provider/hypervisors"
)

var _ hypervisors.CapacityReader = (*Hypervisor)(nil)

// ReadCapacity implements hypervisors.CapacityReader: the node's memory
// (libvirt reports KiB) and CPUs, and the capacity and free space of the
// zone's pool (when one is configured). Three RPCs, each bounded by the call timeout.
func (h *Hypervisor) ReadCapacity(ctx context.Context, zone string) (hypervisors.HostCapacity, error) {
	var c hypervisors.HostCapacity
	zc, err := h.zone(zone)
	if err != nil {
		return c, err
	}
	type nodeInfo struct {
		memKiB uint64
		cpus   int32
	}
	ni, err := rpcValue(ctx, zc, "NodeGetInfo", "node info of "+zone, 0, func(l *golibvirt.Libvirt) (nodeInfo, error) {
		_, mem, cpus, _, _, _, _, _, err := l.NodeGetInfo()
		return nodeInfo{mem, cpus}, err
	})
	if err != nil {
		return c, fmt.Errorf("read capacity of %s: %w", zone, err)
	}
	c.MemoryBytes = ni.memKiB * 1024
	c.CPUs = int(ni.cpus)
	pool := h.poolOf(zone)
	if pool == "" {
		return c, nil // no pool configured: memory and CPUs only
	}
	p, err := h.lookupPool(ctx, zc, pool)
	if err != nil {
		return c, fmt.Errorf("read capacity of %s: %w", zone, err)
	}
	type poolInfo struct{ capacity, available uint64 }
	pi, err := rpcValue(ctx, zc, "StoragePoolGetInfo", "pool info "+pool+" on "+zone, 0, func(l *golibvirt.Libvirt) (poolInfo, error) {
		_, capacity, _, avail, err := l.StoragePoolGetInfo(p)
		return poolInfo{capacity, avail}, err
	})
	if err != nil {
		return c, fmt.Errorf("read capacity of %s: %w", zone, err)
	}
	c.DiskBytes, c.DiskFreeBytes, c.StorageName = pi.capacity, pi.available, pool
	return c, nil
}
