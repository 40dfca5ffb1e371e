package proxmox

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	pxapi "github.com/luthermonson/go-proxmox"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvemarker"
	"github.com/bigfleet-vm/provider/observed"
)

// cfgEntry caches what Observe needs from an owned VM's config.
type cfgEntry struct {
	fp     resource
	at     time.Time
	marker *observed.Marker
	onboot bool
}

// fingerprint is what the listing shows of a VM's config (all but its
// power); a change means the cached config may be stale. (The listing
// carries no config digest.) A comparable value: no formatting per VM and
// observation.
func fingerprint(r *resource) resource {
	fp := *r
	fp.Status = ""
	return fp
}

func powerOf(status, qmp string) observed.Power {
	switch status {
	case "running":
		if qmp == "paused" {
			return observed.PowerPaused
		}
		return observed.PowerRunning
	case "stopped":
		return observed.PowerStopped
	}
	return observed.PowerUnknown
}

// markerFor returns the marker of a VM if it is ours: ownership tags AND
// a description marker of this installation.
func (a *Adapter) markerFor(tags []string, description string) *observed.Marker {
	if !pvemarker.HasOwnershipTags(tags, a.cfg.Installation) {
		return nil
	}
	m := pvemarker.ParseDescription(description)
	if m == nil || m.Installation != a.cfg.Installation {
		return nil
	}
	return m
}

// ownedConfig returns the cached config facts of an owned VM, reading the
// config only when the listing fingerprint changed, we changed the VM, or
// the entry aged past ConfigTTL.
func (a *Adapter) ownedConfig(ctx context.Context, r *resource, tags []string) (*cfgEntry, error) {
	vmid := int(r.VMID)
	fp := fingerprint(r)
	now := a.cfg.Now()
	a.cacheMu.Lock()
	e := a.configs[vmid]
	dirty := a.dirty[vmid]
	a.cacheMu.Unlock()
	if e != nil && e.fp == fp && !dirty && now.Sub(e.at) < a.cfg.ConfigTTL {
		return e, nil
	}
	var cfg pxapi.VirtualMachineConfig
	if err := classify(a.client.Get(ctx, fmt.Sprintf("/nodes/%s/qemu/%d/config", r.Node, vmid), &cfg)); err != nil {
		return nil, fmt.Errorf("read config of vm %d: %w", vmid, err)
	}
	e = &cfgEntry{fp: fp, at: now, marker: a.markerFor(tags, cfg.Description), onboot: bool(cfg.OnBoot)}
	a.cacheMu.Lock()
	a.configs[vmid] = e
	delete(a.dirty, vmid)
	a.cacheMu.Unlock()
	return e, nil
}

// Observe lists one node. A failed listing or config read makes the zone
// unknown (returned with the error), never empty.
func (a *Adapter) Observe(ctx context.Context, zone string) (*observed.Zone, error) {
	if err := a.checkZone(zone); err != nil {
		return nil, err
	}
	a.observed.Add(1)
	at := a.cfg.Now()
	l, err := a.list(ctx, false)
	if err != nil {
		err = fmt.Errorf("observe %s: %w", zone, err)
		return observed.Unknown(zone, err, at), err
	}
	if _, why := nodeProblem(l, zone); why != nil {
		err = fmt.Errorf("observe %s: %w: %w", zone, why, hypervisors.ErrUnreachable)
		return observed.Unknown(zone, err, at), err
	}
	rs := l.vms
	z := &observed.Zone{Name: zone, Status: observed.StatusOK, At: at}
	seen := map[int]bool{}
	for i := range rs {
		r := &rs[i]
		if r.Node != zone {
			continue
		}
		tags := tagList(r.Tags)
		sort.Strings(tags)
		v := &observed.VM{
			Zone: zone, Name: r.Name, VMID: int(r.VMID), Power: powerOf(r.Status, ""),
			VCPU: int(r.MaxCPU), MemoryMiB: int(r.MaxMem >> 20), Template: r.Template == 1,
		}
		if !v.Template && pvemarker.HasOwnershipTags(tags, a.cfg.Installation) {
			e, err := a.ownedConfig(ctx, r, tags)
			if errors.Is(err, hypervisors.ErrNotFound) {
				continue // destroyed since the listing
			}
			if err != nil {
				err = fmt.Errorf("observe %s: %w", zone, err)
				return observed.Unknown(zone, err, at), err
			}
			v.Marker, v.Autostart = e.marker, e.onboot
		}
		seen[v.VMID] = true
		z.VMs = append(z.VMs, v)
	}
	sort.Slice(z.VMs, func(i, j int) bool { return z.VMs[i].VMID < z.VMs[j].VMID })
	a.forget(l)
	return z, nil
}

// forget drops cache entries of VMs no longer listed anywhere, keeping
// owner notes made after the listing was sent (a clone it cannot show).
// A dirty mark goes with its VM: a VM that comes back has no config entry,
// so its config is read anyway. So every map stays bounded by the VMs
// listed plus those changed since the listing was sent.
func (a *Adapter) forget(l *listing) {
	live := make(map[int]bool, len(l.vms))
	for i := range l.vms {
		live[int(l.vms[i].VMID)] = true
	}
	a.cacheMu.Lock()
	defer a.cacheMu.Unlock()
	for id := range a.configs {
		if !live[id] {
			delete(a.configs, id)
		}
	}
	for id := range a.dirty {
		if !live[id] {
			delete(a.dirty, id)
		}
	}
	for id, o := range a.owners {
		if !live[id] && o.at.Before(l.at) {
			delete(a.owners, id)
		}
	}
}

// Lookup re-reads one VM by VMID on its node (ErrNotFound if absent).
func (a *Adapter) Lookup(ctx context.Context, t hypervisors.Target) (*observed.VM, error) {
	if err := a.checkZone(t.Zone); err != nil {
		return nil, err
	}
	v, err := a.readVM(ctx, t.Zone, t.VMID)
	if err != nil {
		return nil, fmt.Errorf("lookup vm %d on %s: %w", t.VMID, t.Zone, err)
	}
	return a.toObserved(t.Zone, v), nil
}

func (a *Adapter) toObserved(zone string, v *pxapi.VirtualMachine) *observed.VM {
	c := v.VirtualMachineConfig
	if c == nil {
		c = &pxapi.VirtualMachineConfig{}
	}
	cores, sockets := 1, 1
	if c.Cores != nil {
		cores = *c.Cores
	}
	if c.Sockets != nil {
		sockets = *c.Sockets
	}
	o := &observed.VM{
		Zone: zone, Name: c.Name, VMID: int(v.VMID), Power: powerOf(v.Status, v.QMPStatus),
		VCPU: cores * sockets, MemoryMiB: int(c.Memory), Template: bool(v.Template) || bool(c.Template),
		Autostart: bool(c.OnBoot),
	}
	if !o.Template {
		o.Marker = a.markerFor(tagList(c.Tags), c.Description)
	}
	return o
}
