package proxmox

import (
	"context"
	"fmt"

	pxapi "github.com/luthermonson/go-proxmox"

	"github.com/bigfleet-vm/provider/hypervisors"
)

var _ hypervisors.CapacityReader = (*Adapter)(nil)

// ReadCapacity implements hypervisors.CapacityReader: the node's memory
// and CPUs (GET /nodes/{node}/status, Sys.Audit) and, when a target
// storage is configured, its total and free space (GET
// /nodes/{node}/storage/{storage}/status, Datastore.Audit). Each request
// is bounded by HTTPTimeout.
func (a *Adapter) ReadCapacity(ctx context.Context, zone string) (hypervisors.HostCapacity, error) {
	var c hypervisors.HostCapacity
	if err := a.checkZone(zone); err != nil {
		return c, err
	}
	n := (&pxapi.Node{}).New(a.client, zone)
	if err := n.Status(ctx); err != nil {
		return c, fmt.Errorf("read capacity of %s: node status: %w", zone, classify(err))
	}
	c.MemoryBytes, c.CPUs = n.Memory.Total, n.CPUInfo.CPUs
	if a.cfg.Storage == "" {
		return c, nil // clones keep the template's storage: not known here
	}
	st, err := n.Storage(ctx, a.cfg.Storage)
	if err != nil {
		return c, fmt.Errorf("read capacity of %s: storage %s: %w", zone, a.cfg.Storage, classify(err))
	}
	c.DiskBytes, c.DiskFreeBytes, c.StorageName = st.Total, st.Avail, a.cfg.Storage
	return c, nil
}
