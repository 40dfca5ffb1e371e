package proxmox

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	pxapi "github.com/luthermonson/go-proxmox"

	"github.com/bigfleet-vm/provider/hypervisors"
)

var _ hypervisors.CapacityReader = (*Adapter)(nil)

// ReadCapacity implements hypervisors.CapacityReader: the node's memory
// and CPUs (GET /nodes/{node}/status, Sys.Audit) and the target storage's
// total and free space on the node (GET
// /nodes/{node}/storage/{storage}/status, Datastore.Audit; a shared
// storage is read through the zone's node like a local one).
//
// The target storage is Config.Storage, or else the storage holding the
// templates' disks, where a full clone without a target storage puts its
// disks (targetStorages). When the templates' disks are on several
// storages, each is read and the one with the least free space is
// reported: the first a clone can run out of. Each request is bounded by
// HTTPTimeout.
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
	storages, err := a.targetStorages(ctx)
	if err != nil {
		return c, fmt.Errorf("read capacity of %s: target storage: %w", zone, err)
	}
	var tight *pxapi.Storage
	for _, name := range storages {
		st, err := n.Storage(ctx, name)
		if err != nil {
			return c, fmt.Errorf("read capacity of %s: storage %s: %w", zone, name, classify(err))
		}
		if tight == nil || st.Avail < tight.Avail {
			tight = st
		}
	}
	if tight != nil {
		c.DiskBytes, c.DiskFreeBytes, c.StorageName = tight.Total, tight.Avail, tight.Name
	}
	return c, nil
}

// templateStorages is the cached answer of targetStorages without
// Config.Storage: the distinct storages of the templates' disks, sorted,
// and when they were read (Config.Now). One per adapter, re-read after
// ConfigTTL.
type templateStorages struct {
	names []string
	at    time.Time
}

// targetStorages returns the storages full clones land on: Config.Storage
// when set; else the storages of the disks of Config.Templates, read from
// each template's config (GET /nodes/{node}/qemu/{vmid}/config, the node
// from the cluster listing) and kept for ConfigTTL (templates rarely
// change). Callers share one refresh; nil when there is no template.
func (a *Adapter) targetStorages(ctx context.Context) ([]string, error) {
	if a.cfg.Storage != "" {
		return []string{a.cfg.Storage}, nil
	}
	if len(a.cfg.Templates) == 0 {
		return nil, nil
	}
	if names, ok := a.cachedTemplateStorages(); ok {
		return names, nil
	}
	select {
	case a.tmplSem <- struct{}{}:
		defer func() { <-a.tmplSem }()
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for the templates' storage: %w", ctxErr(ctx))
	}
	if names, ok := a.cachedTemplateStorages(); ok { // read meanwhile
		return names, nil
	}
	at := a.cfg.Now()
	l, err := a.list(ctx, false)
	if err != nil {
		return nil, err
	}
	nodeOf := make(map[int]string, len(a.cfg.Templates))
	for _, r := range l.vms {
		nodeOf[int(r.VMID)] = r.Node
	}
	var names []string
	for _, t := range a.cfg.Templates {
		node, ok := nodeOf[t]
		if !ok {
			return nil, fmt.Errorf("template %d is not in the cluster listing: %w", t, hypervisors.ErrNotFound)
		}
		var conf map[string]any
		if err := a.client.Get(ctx, fmt.Sprintf("/nodes/%s/qemu/%d/config", node, t), &conf); err != nil {
			return nil, fmt.Errorf("read template %d config: %w", t, classify(err))
		}
		names = append(names, diskStorages(conf)...)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	a.tmplMu.Lock()
	a.tmplStorages = &templateStorages{names: names, at: at}
	a.tmplMu.Unlock()
	return names, nil
}

// cachedTemplateStorages is the templates' storages read less than
// ConfigTTL ago.
func (a *Adapter) cachedTemplateStorages() ([]string, bool) {
	a.tmplMu.Lock()
	defer a.tmplMu.Unlock()
	c := a.tmplStorages
	if c == nil || a.cfg.Now().Sub(c.at) >= a.cfg.ConfigTTL {
		return nil, false
	}
	return c.names, true
}

// diskKey matches the config keys of a VM's disks.
var diskKey = regexp.MustCompile(`^(?:(?:scsi|virtio|sata|ide)\d+|efidisk0|tpmstate0)$`)

// diskStorages returns the storages of a VM config's disks (values
// "storage:volume,opt=...,..."): CD-ROMs (media=cdrom, the cloud-init
// drive among them), empty drives ("none") and volumes given as a path
// (no storage) are left out. Unsorted, possibly repeated.
func diskStorages(conf map[string]any) []string {
	var out []string
	for k, v := range conf {
		s, ok := v.(string)
		if !ok || !diskKey.MatchString(k) {
			continue
		}
		opts := strings.Split(s, ",")
		if slices.Contains(opts[1:], "media=cdrom") {
			continue
		}
		vol := strings.TrimPrefix(opts[0], "file=")
		storage, _, ok := strings.Cut(vol, ":")
		if !ok || storage == "" || strings.HasPrefix(storage, "/") || vol == "none" {
			continue
		}
		out = append(out, storage)
	}
	return out
}
