package libvirt

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
	"github.com/bigfleet-vm/provider/observed"
)

// zoneCache keeps what Observe last read per domain (by UUID) and per
// volume (by key), so a steady-state tick reads no per-object detail.
// A cached seed volume is re-read when the adapter rewrote it or its read
// is older than Config.RefreshEvery (its identity comes from each tick's
// listing).
type zoneCache struct {
	mu    sync.Mutex // held for a whole Observe tick of the zone
	doms  map[golibvirt.UUID]*domEntry
	vols  map[string]*volEntry
	pools map[string]golibvirt.StoragePool
	dirty *dirtySet // own lock: mutations never wait for a tick
}

// dirtySet holds the names of domains and volumes mutated through the
// adapter.
type dirtySet struct {
	mu    sync.Mutex
	names map[string]bool // domain names mutated through the adapter
	vols  map[string]bool // volume names rewritten through the adapter
}

// domEntry is one cached domain read. It is reused while the domain's id
// and state are unchanged, it is not dirty and it is younger than
// Config.RefreshEvery.
type domEntry struct {
	id    int32
	state golibvirt.DomainState
	read  time.Time
	dom   *domainRead
}

// volEntry is one cached volume read.
type volEntry struct {
	read     time.Time
	vol      *observed.Volume
	capacity uint64
}

func newZoneCache() *zoneCache {
	return &zoneCache{
		doms: map[golibvirt.UUID]*domEntry{}, vols: map[string]*volEntry{},
		pools: map[string]golibvirt.StoragePool{}, dirty: &dirtySet{names: map[string]bool{}, vols: map[string]bool{}},
	}
}

// touchVolume marks a volume name for re-reading on the next Observe.
func (c *zoneCache) touchVolume(name string) {
	c.dirty.mu.Lock()
	c.dirty.vols[name] = true
	c.dirty.mu.Unlock()
}

// takeDirtyVolumes returns and clears the dirty volume set.
func (c *zoneCache) takeDirtyVolumes() map[string]bool {
	c.dirty.mu.Lock()
	defer c.dirty.mu.Unlock()
	d := c.dirty.vols
	c.dirty.vols = map[string]bool{}
	return d
}

// touch marks a domain name for re-reading on the next Observe.
func (c *zoneCache) touch(name string) {
	c.dirty.mu.Lock()
	c.dirty.names[name] = true
	c.dirty.mu.Unlock()
}

// takeDirty returns and clears the dirty set.
func (c *zoneCache) takeDirty() map[string]bool {
	c.dirty.mu.Lock()
	defer c.dirty.mu.Unlock()
	d := c.dirty.names
	c.dirty.names = map[string]bool{}
	return d
}

// Observe implements hypervisors.Hypervisor. On error the zone is unknown:
// the returned observation has StatusUnknown and the error wraps a class
// (ErrUnreachable when the host is not connected).
func (h *Hypervisor) Observe(ctx context.Context, zone string) (*observed.Zone, error) {
	at := h.now()
	z, err := h.observe(ctx, zone, at)
	if err != nil {
		err = fmt.Errorf("observe %s: %w", zone, err)
		return observed.Unknown(zone, err, at), err
	}
	return z, nil
}

func (h *Hypervisor) observe(ctx context.Context, zone string, at time.Time) (*observed.Zone, error) {
	zc, err := h.zone(zone)
	if err != nil {
		return nil, err
	}
	cache := h.caches[zone]
	// Observes of one zone are serialised by holding mu for the tick.
	cache.mu.Lock()
	defer cache.mu.Unlock()
	dirty := cache.takeDirty()

	type listed struct {
		dom   golibvirt.Domain
		state golibvirt.DomainState
	}
	var doms []listed
	// NOWAIT: a domain busy in a long job (a destroy takes 1-2 s) must
	// not stall the whole zone's listing; its state is always reported.
	stats := func(flags golibvirt.ConnectGetAllDomainStatsFlags) ([]golibvirt.DomainStatsRecord, error) {
		return rpcValue(ctx, zc, "ConnectGetAllDomainStats", "list domains on "+zone, 0, func(l *golibvirt.Libvirt) ([]golibvirt.DomainStatsRecord, error) {
			return l.ConnectGetAllDomainStats(nil, uint32(golibvirt.DomainStatsState), uint32(flags))
		})
	}
	recs, err := stats(golibvirt.ConnectGetAllDomainsStatsNowait)
	if isCode(err, golibvirt.ErrInvalidArg, golibvirt.ErrNoSupport) {
		recs, err = stats(0)
	}
	switch {
	case err == nil:
		for _, r := range recs {
			doms = append(doms, listed{r.Dom, stateParam(r.Params)})
		}
	case errors.Is(err, hypervisors.ErrUnsupported):
		// Drivers without bulk stats: list, then one state call each.
		all, err := rpcValue(ctx, zc, "ConnectListAllDomains", "list domains on "+zone, 0, func(l *golibvirt.Libvirt) ([]golibvirt.Domain, error) {
			all, _, err := l.ConnectListAllDomains(1, 0)
			return all, err
		})
		if err != nil {
			return nil, err
		}
		for _, d := range all {
			st, err := h.domainState(ctx, zc, d)
			if errors.Is(err, hypervisors.ErrNotFound) {
				continue
			} else if err != nil {
				return nil, err
			}
			doms = append(doms, listed{d, st})
		}
	default:
		return nil, err
	}

	autostart, err := rpcValue(ctx, zc, "ConnectListAllDomains", "list autostart domains on "+zone, 0, func(l *golibvirt.Libvirt) ([]golibvirt.Domain, error) {
		autostart, _, err := l.ConnectListAllDomains(1, golibvirt.ConnectListDomainsAutostart)
		return autostart, err
	})
	if err != nil {
		return nil, err
	}
	auto := make(map[golibvirt.UUID]bool, len(autostart))
	for _, d := range autostart {
		auto[d.UUID] = true
	}

	out := &observed.Zone{Name: zone, Status: observed.StatusOK, At: at}
	seen := make(map[golibvirt.UUID]bool, len(doms))
	for _, ld := range doms {
		seen[ld.dom.UUID] = true
		e := cache.doms[ld.dom.UUID]
		if e == nil || e.id != ld.dom.ID || e.state != ld.state || dirty[ld.dom.Name] ||
			at.Sub(e.read) >= h.cfg.RefreshEvery {
			d, err := h.domainXML(ctx, zc, ld.dom)
			if errors.Is(err, hypervisors.ErrNotFound) {
				delete(cache.doms, ld.dom.UUID) // undefined since the listing
				continue
			} else if err != nil {
				return nil, err
			}
			e = &domEntry{id: ld.dom.ID, state: ld.state, read: at, dom: d}
			cache.doms[ld.dom.UUID] = e
			if m := d.marker(); m != nil && m.Installation == h.cfg.Installation {
				h.setOwner(zone, ld.dom.Name, m.MachineID)
			}
		}
		out.VMs = append(out.VMs, h.vmFrom(zone, e.dom, power(ld.state), auto[ld.dom.UUID]))
	}
	names := make(map[string]bool, len(doms))
	for _, ld := range doms {
		names[ld.dom.Name] = true
	}
	for u := range cache.doms {
		if !seen[u] {
			delete(cache.doms, u)
		}
	}
	h.pruneOwners(zone, names, at)
	sort.Slice(out.VMs, func(i, j int) bool { return out.VMs[i].Name < out.VMs[j].Name })

	if pool := h.poolOf(zone); pool != "" {
		vols, err := h.observeVolumes(ctx, zc, cache, pool, at)
		if err != nil {
			return nil, err
		}
		out.Volumes = vols
	}
	return out, nil
}

// poolOf is the pool Observe lists in a zone.
func (h *Hypervisor) poolOf(zone string) string {
	for _, z := range h.cfg.Zones {
		if z.Zone == zone && z.Pool != "" {
			return z.Pool
		}
	}
	return h.cfg.Pool
}

// observeVolumes lists the pool's bf- volumes; format, backing format and
// capacity are read once per volume key (a seed's also after the adapter
// rewrote it, or RefreshEvery), and a seed's identity comes from the
// listing itself (its identity tag, see seedTag), never from its bytes.
// Identity tags are not reported as volumes. The caller holds cache.mu.
func (h *Hypervisor) observeVolumes(ctx context.Context, zc *zoneConn, cache *zoneCache, pool string, at time.Time) ([]*observed.Volume, error) {
	dirty := cache.takeDirtyVolumes()
	p, ok := cache.pools[pool]
	if !ok {
		var err error
		p, err = h.lookupPool(ctx, zc, pool)
		if err != nil {
			return nil, err
		}
		cache.pools[pool] = p
	}
	vols, err := rpcValue(ctx, zc, "StoragePoolListAllVolumes", "list volumes "+pool+" on "+zc.zone, 0, func(l *golibvirt.Libvirt) ([]golibvirt.StorageVol, error) {
		vols, _, err := l.StoragePoolListAllVolumes(p, 1, 0)
		return vols, err
	})
	if errors.Is(err, hypervisors.ErrNotFound) {
		delete(cache.pools, pool) // redefined pool: look it up again next time
	}
	if err != nil {
		return nil, err
	}
	names := make([]string, len(vols))
	for i, v := range vols {
		names[i] = v.Name
	}
	tags := seedTags(names)
	var out []*observed.Volume
	seen := map[string]bool{}
	for _, v := range vols {
		if !strings.HasPrefix(v.Name, lvspec.VolumePrefix) {
			continue
		}
		if _, isTag := parseSeedTag(v.Name); isTag {
			continue
		}
		key := v.Key + "\x00" + v.Name
		seen[key] = true
		e := cache.vols[key]
		if e == nil || isSeedVolume(v.Name) && (dirty[v.Name] || at.Sub(e.read) >= h.cfg.RefreshEvery) {
			ov, capacity, err := h.readVolume(ctx, zc, pool, v, nil)
			if errors.Is(err, hypervisors.ErrNotFound) {
				continue
			} else if err != nil {
				return nil, err
			}
			e = &volEntry{read: at, vol: ov, capacity: capacity}
			cache.vols[key] = e
		}
		c := *e.vol
		if isSeedVolume(v.Name) {
			c.Identity = seedIdentity(tags[v.Name], e.capacity)
		}
		out = append(out, &c)
	}
	for k := range cache.vols {
		if !seen[k] {
			delete(cache.vols, k)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// stateParam extracts state.state from a stats record.
func stateParam(ps []golibvirt.TypedParam) golibvirt.DomainState {
	for _, p := range ps {
		if p.Field != golibvirt.DomainStatsStateState {
			continue
		}
		switch v := p.Value.I.(type) {
		case int32:
			return golibvirt.DomainState(v)
		case uint32:
			return golibvirt.DomainState(v)
		case int64:
			return golibvirt.DomainState(v)
		case uint64:
			return golibvirt.DomainState(v)
		}
	}
	return golibvirt.DomainNostate
}
