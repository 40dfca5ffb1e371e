package libvirt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/retry"
)

// Hypervisor is the libvirt adapter. Its methods are safe for concurrent
// use; calls on different zones never wait for each other.
type Hypervisor struct {
	cfg    Config
	log    *slog.Logger
	order  []string
	zones  map[string]*zoneConn
	caches map[string]*zoneCache
	calls  atomic.Int64
	probes atomic.Int64
	now    func() time.Time
	events *hypervisors.EventQueue
	// uploadPace, when set, runs before each chunk of a seed upload, and
	// uploadChunk, when positive, replaces the chunk size (tests slow an
	// upload down to make it time out half-way).
	uploadPace  func(context.Context)
	uploadChunk int
	// rpcs is told about every RPC (ObserveRPCs).
	rpcs atomic.Pointer[func(zone, procedure string, d time.Duration, err error)]

	// owners maps "zone\x00domain name" to the machine id the adapter
	// last saw in its marker or defined it for, so lifecycle events name
	// their machine even after the domain is gone. Each Observe of a zone
	// forgets the zone's entries its listing did not show that are older
	// than the listing (pruneOwners), so the map holds the listed domains
	// plus those defined since, however many come and go between listings.
	ownersMu sync.Mutex
	owners   map[string]ownerNote

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

var (
	_ hypervisors.Hypervisor     = (*Hypervisor)(nil)
	_ lvspec.Steps               = (*Hypervisor)(nil)
	_ hypervisors.HealthReporter = (*Hypervisor)(nil)
	_ hypervisors.EventSource    = (*Hypervisor)(nil)
	_ hypervisors.VolumeReader   = (*Hypervisor)(nil)
)

// New validates cfg and returns at once; each zone dials in the background
// and reconnects with backoff for as long as the adapter is open.
func New(cfg Config, logger *slog.Logger) (*Hypervisor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &Hypervisor{
		cfg: cfg, log: logger, cancel: cancel, now: time.Now,
		zones: map[string]*zoneConn{}, caches: map[string]*zoneCache{},
		events: hypervisors.NewEventQueue(), owners: map[string]ownerNote{},
	}
	for _, z := range cfg.Zones {
		u, _ := url.Parse(z.URI) // validated above
		h.caches[z.Zone] = newZoneCache()
		zc := newZoneConn(z.Zone, u, &h.cfg, logger, &h.calls, &h.probes)
		zc.events = h.events
		zc.observe = h.observeRPC
		zone := z.Zone
		zc.owner = func(name string) string { return h.owner(zone, name) }
		cache := h.caches[zone]
		zc.changed = cache.touch
		h.zones[z.Zone] = zc
		h.order = append(h.order, z.Zone)
		h.wg.Add(1)
		go func() { defer h.wg.Done(); zc.run(ctx) }()
	}
	sort.Strings(h.order)
	return h, nil
}

// Apply performs one libvirt step.
func (h *Hypervisor) Apply(ctx context.Context, t hypervisors.Target, p hypervisors.StepParams) (int, error) {
	return lvspec.Apply(ctx, h, t, p)
}

// Zones implements hypervisors.Hypervisor.
func (h *Hypervisor) Zones() []string { return append([]string(nil), h.order...) }

// Calls returns how many libvirt calls the adapter has made so far
// (connection probes not included; see Probes).
func (h *Hypervisor) Calls() int64 { return h.calls.Load() }

// Probes returns how many liveness probes the adapter has sent.
func (h *Hypervisor) Probes() int64 { return h.probes.Load() }

// ObserveRPCs has f told, for every libvirt RPC the adapter makes, its
// zone, its procedure (go-libvirt's name, e.g. "DomainGetXMLDesc"; "" for
// the connection's liveness probe), how long the caller waited and how it
// ended (errors.Is(err, ...) works as for the adapter's own errors; a call
// given up on has a non-nil error). One adapter operation makes several
// RPCs. f must be fast and safe for concurrent use.
func (h *Hypervisor) ObserveRPCs(f func(zone, procedure string, d time.Duration, err error)) {
	h.rpcs.Store(&f)
}

func (h *Hypervisor) observeRPC(zone, procedure string, d time.Duration, err error) {
	if f := h.rpcs.Load(); f != nil {
		(*f)(zone, procedure, d, err)
	}
}

// Events implements hypervisors.EventSource: zone up/down and every
// domain lifecycle event of every connected zone, coalesced per domain.
func (h *Hypervisor) Events() <-chan hypervisors.Event { return h.events.C() }

// ownerNote is a domain's machine and when the adapter noted it.
type ownerNote struct {
	id string
	at time.Time
}

// setOwner records that a domain belongs to a machine (id "" forgets it).
func (h *Hypervisor) setOwner(zone, name, id string) {
	h.ownersMu.Lock()
	defer h.ownersMu.Unlock()
	if id == "" {
		delete(h.owners, zone+"\x00"+name)
		return
	}
	h.owners[zone+"\x00"+name] = ownerNote{id: id, at: h.now()}
}

func (h *Hypervisor) owner(zone, name string) string {
	h.ownersMu.Lock()
	defer h.ownersMu.Unlock()
	return h.owners[zone+"\x00"+name].id
}

// pruneOwners forgets the zone's owner notes of domains a listing started
// at listed did not show (listed names), unless noted after it started
// (a domain defined since, which the listing could not show).
func (h *Hypervisor) pruneOwners(zone string, names map[string]bool, listed time.Time) {
	h.ownersMu.Lock()
	defer h.ownersMu.Unlock()
	prefix := zone + "\x00"
	for k, n := range h.owners {
		name, ok := strings.CutPrefix(k, prefix)
		if ok && !names[name] && n.at.Before(listed) {
			delete(h.owners, k)
		}
	}
}

// ZoneHealth implements hypervisors.HealthReporter.
func (h *Hypervisor) ZoneHealth() map[string]error {
	out := make(map[string]error, len(h.zones))
	for name, zc := range h.zones {
		out[name] = zc.health()
	}
	return out
}

// WaitConnected blocks until every zone has finished its first dial attempt
// (successful or not) or ctx ends. It is for tests and startup probes; no
// method needs it.
func (h *Hypervisor) WaitConnected(ctx context.Context) error {
	for _, zc := range h.zones {
		select {
		case <-zc.ready:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Close stops the reconnect loops, drops every connection and closes
// the event channel.
func (h *Hypervisor) Close() error {
	h.cancel()
	h.wg.Wait()
	h.events.Close()
	return nil
}

func (h *Hypervisor) zone(zone string) (*zoneConn, error) {
	zc, ok := h.zones[zone]
	if !ok {
		return nil, fmt.Errorf("zone %q is not configured: %w", zone, hypervisors.ErrInvalid)
	}
	return zc, nil
}

// ---- domain helpers ----

func (h *Hypervisor) lookupDomain(ctx context.Context, zc *zoneConn, name string) (golibvirt.Domain, error) {
	return rpcValue(ctx, zc, "DomainLookupByName", "lookup domain "+name+" on "+zc.zone, 0, func(l *golibvirt.Libvirt) (golibvirt.Domain, error) {
		return l.DomainLookupByName(name)
	})
}

func (h *Hypervisor) domainState(ctx context.Context, zc *zoneConn, dom golibvirt.Domain) (golibvirt.DomainState, error) {
	st, _, err := h.domainStateReason(ctx, zc, dom)
	return st, err
}

// domainStateReason is the domain's state and libvirt's reason for it
// (for DomainPaused, a golibvirt.DomainPausedReason).
func (h *Hypervisor) domainStateReason(ctx context.Context, zc *zoneConn, dom golibvirt.Domain) (golibvirt.DomainState, int32, error) {
	sr, err := rpcValue(ctx, zc, "DomainGetState", "state of "+dom.Name+" on "+zc.zone, 0, func(l *golibvirt.Libvirt) ([2]int32, error) {
		st, reason, err := l.DomainGetState(dom, 0)
		return [2]int32{st, reason}, err
	})
	return golibvirt.DomainState(sr[0]), sr[1], err
}

func (h *Hypervisor) domainXML(ctx context.Context, zc *zoneConn, dom golibvirt.Domain) (*domainRead, error) {
	s, err := rpcValue(ctx, zc, "DomainGetXMLDesc", "read "+dom.Name+" on "+zc.zone, 0, func(l *golibvirt.Libvirt) (string, error) {
		return l.DomainGetXMLDesc(dom, 0)
	})
	if err != nil {
		return nil, err
	}
	return parseDomain(s)
}

// checkOwned re-reads the domain's marker and fails with ErrNotOwned unless
// it names this installation.
func (h *Hypervisor) checkOwned(ctx context.Context, zc *zoneConn, dom golibvirt.Domain) (*observed.Marker, error) {
	d, err := h.domainXML(ctx, zc, dom)
	if err != nil {
		return nil, err
	}
	m := d.marker()
	if m == nil || m.Installation != h.cfg.Installation {
		return nil, fmt.Errorf("domain %s on %s: %w", dom.Name, zc.zone, hypervisors.ErrNotOwned)
	}
	return m, nil
}

// ownedDomain looks a domain up for a destructive step: found is false
// (and err nil) when it is already gone; a domain without our marker is
// ErrNotOwned.
func (h *Hypervisor) ownedDomain(ctx context.Context, zc *zoneConn, name string) (dom golibvirt.Domain, found bool, err error) {
	dom, err = h.lookupDomain(ctx, zc, name)
	if errors.Is(err, hypervisors.ErrNotFound) {
		return dom, false, nil
	}
	if err == nil {
		_, err = h.checkOwned(ctx, zc, dom)
	}
	return dom, err == nil, err
}

// wrapf wraps err with what was being done; nil stays nil.
func wrapf(err error, format string, a ...any) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf(format+": %w", append(a, err)...)
}

func power(st golibvirt.DomainState) observed.Power {
	switch st {
	case golibvirt.DomainRunning, golibvirt.DomainBlocked, golibvirt.DomainShutdown:
		return observed.PowerRunning
	case golibvirt.DomainPaused, golibvirt.DomainPmsuspended:
		return observed.PowerPaused
	case golibvirt.DomainShutoff:
		return observed.PowerStopped
	case golibvirt.DomainCrashed:
		return observed.PowerCrashed
	}
	return observed.PowerUnknown
}

// ---- read path ----

// Lookup implements hypervisors.Hypervisor; it always reads fresh.
func (h *Hypervisor) Lookup(ctx context.Context, t hypervisors.Target) (*observed.VM, error) {
	zc, err := h.zone(t.Zone)
	if err != nil {
		return nil, err
	}
	dom, err := h.lookupDomain(ctx, zc, t.Name)
	if err != nil {
		return nil, err
	}
	st, err := h.domainState(ctx, zc, dom)
	if err != nil {
		return nil, err
	}
	d, err := h.domainXML(ctx, zc, dom)
	if err != nil {
		return nil, err
	}
	auto, err := rpcValue(ctx, zc, "DomainGetAutostart", "autostart of "+t.Name, 0, func(l *golibvirt.Libvirt) (int32, error) {
		return l.DomainGetAutostart(dom)
	})
	if err != nil {
		return nil, err
	}
	return h.vmFrom(t.Zone, d, power(st), auto == 1), nil
}

func (h *Hypervisor) vmFrom(zone string, d *domainRead, p observed.Power, autostart bool) *observed.VM {
	vm := &observed.VM{
		Zone: zone, Name: d.Name, Power: p, VCPU: d.VCPU, MemoryMiB: d.memoryMiB(),
		Autostart: autostart, Volumes: d.volumes(),
	}
	if m := d.marker(); m != nil && m.Installation == h.cfg.Installation {
		vm.Marker = m
	}
	return vm
}

// ---- storage ----

func (h *Hypervisor) lookupPool(ctx context.Context, zc *zoneConn, pool string) (golibvirt.StoragePool, error) {
	return rpcValue(ctx, zc, "StoragePoolLookupByName", "lookup pool "+pool+" on "+zc.zone, 0, func(l *golibvirt.Libvirt) (golibvirt.StoragePool, error) {
		return l.StoragePoolLookupByName(pool)
	})
}

func (h *Hypervisor) lookupVolume(ctx context.Context, zc *zoneConn, p golibvirt.StoragePool, name string) (golibvirt.StorageVol, error) {
	return rpcValue(ctx, zc, "StorageVolLookupByName", "lookup volume "+p.Name+"/"+name+" on "+zc.zone, 0, func(l *golibvirt.Libvirt) (golibvirt.StorageVol, error) {
		return l.StorageVolLookupByName(p, name)
	})
}

func (h *Hypervisor) volumeXML(ctx context.Context, zc *zoneConn, v golibvirt.StorageVol) (*volumeRead, error) {
	s, err := rpcValue(ctx, zc, "StorageVolGetXMLDesc", "read volume "+v.Pool+"/"+v.Name+" on "+zc.zone, 0, func(l *golibvirt.Libvirt) (string, error) {
		return l.StorageVolGetXMLDesc(v, 0)
	})
	if err != nil {
		return nil, err
	}
	return parseVolume(s)
}

// CreateOverlay implements lvspec.Steps. An existing volume of
// the name is success.
func (h *Hypervisor) CreateOverlay(ctx context.Context, zone string, spec lvspec.OverlaySpec) error {
	zc, err := h.zone(zone)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(spec.Name, lvspec.VolumePrefix) {
		return fmt.Errorf("overlay %q lacks prefix %q: %w", spec.Name, lvspec.VolumePrefix, hypervisors.ErrInvalid)
	}
	p, err := h.lookupPool(ctx, zc, spec.Pool)
	if err != nil {
		return fmt.Errorf("create overlay %s: %w", spec.Name, err)
	}
	if _, err := h.lookupVolume(ctx, zc, p, spec.Name); err == nil {
		return nil
	} else if !errors.Is(err, hypervisors.ErrNotFound) {
		return fmt.Errorf("create overlay %s: %w", spec.Name, err)
	}
	base, err := h.lookupVolume(ctx, zc, p, spec.BaseImage)
	if err != nil {
		return fmt.Errorf("create overlay %s: base image: %w", spec.Name, err)
	}
	bx, err := h.volumeXML(ctx, zc, base)
	if err != nil {
		return fmt.Errorf("create overlay %s: %w", spec.Name, err)
	}
	format := bx.format
	switch format {
	case "qcow2", "raw":
	default:
		return fmt.Errorf("create overlay %s: base %s has format %q, want qcow2 or raw: %w", spec.Name, spec.BaseImage, format, hypervisors.ErrInvalid)
	}
	capacity := max(bx.capacity, uint64(spec.MinCapacityGiB)<<30)
	def, err := overlayDefinition(spec.Name, capacity, bx.path, format)
	if err != nil {
		return err
	}
	err = zc.rpc(ctx, "StorageVolCreateXML", "create volume "+spec.Pool+"/"+spec.Name+" on "+zone, 0, func(l *golibvirt.Libvirt) error {
		_, err := l.StorageVolCreateXML(p, def, 0)
		return err
	})
	if err != nil && !errors.Is(err, hypervisors.ErrExists) {
		return fmt.Errorf("create overlay %s: %w", spec.Name, err)
	}
	return nil
}

// listVolumes lists a pool's volumes (one RPC) by name.
func (h *Hypervisor) listVolumes(ctx context.Context, zc *zoneConn, p golibvirt.StoragePool) (map[string]golibvirt.StorageVol, []string, error) {
	vols, err := rpcValue(ctx, zc, "StoragePoolListAllVolumes", "list volumes "+p.Name+" on "+zc.zone, 0, func(l *golibvirt.Libvirt) ([]golibvirt.StorageVol, error) {
		vols, _, err := l.StoragePoolListAllVolumes(p, 1, 0)
		return vols, err
	})
	if err != nil {
		return nil, nil, err
	}
	byName := make(map[string]golibvirt.StorageVol, len(vols))
	names := make([]string, 0, len(vols))
	for _, v := range vols {
		byName[v.Name] = v
		names = append(names, v.Name)
	}
	return byName, names, nil
}

// dropSeedTags deletes every identity tag of seed among a listing.
func (h *Hypervisor) dropSeedTags(ctx context.Context, zc *zoneConn, vols map[string]golibvirt.StorageVol, names []string, seed string) error {
	for _, t := range seedTags(names)[seed] {
		if err := h.deleteVol(ctx, zc, vols[t.name]); err != nil && !errors.Is(err, hypervisors.ErrNotFound) {
			return fmt.Errorf("drop identity tag %s: %w", t.name, err)
		}
	}
	return nil
}

// CreateSeed implements lvspec.Steps. The seed is (re)uploaded
// even when the volume exists, so a crash between create and upload
// converges; a volume of the wrong size is replaced. Its identity tag is
// removed first and added last (see seedTag).
func (h *Hypervisor) CreateSeed(ctx context.Context, zone string, spec lvspec.SeedSpec) error {
	zc, err := h.zone(zone)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(spec.Name, lvspec.VolumePrefix) || !isSeedVolume(spec.Name) {
		return fmt.Errorf("seed %q lacks prefix %q or suffix %q: %w", spec.Name, lvspec.VolumePrefix, lvspec.SeedVolume(""), hypervisors.ErrInvalid)
	}
	img, err := buildSeed(spec)
	if err != nil {
		return err
	}
	defer h.caches[zone].touchVolume(spec.Name)
	p, err := h.lookupPool(ctx, zc, spec.Pool)
	if err != nil {
		return fmt.Errorf("create seed %s: %w", spec.Name, err)
	}
	vols, names, err := h.listVolumes(ctx, zc, p)
	if err != nil {
		return fmt.Errorf("create seed %s: %w", spec.Name, err)
	}
	if err := h.dropSeedTags(ctx, zc, vols, names, spec.Name); err != nil {
		return fmt.Errorf("create seed %s: %w", spec.Name, err)
	}
	size := uint64(len(img))
	vol, found := vols[spec.Name]
	if found {
		vx, err := h.volumeXML(ctx, zc, vol)
		if errors.Is(err, hypervisors.ErrNotFound) {
			found = false
		} else if err != nil {
			return fmt.Errorf("create seed %s: %w", spec.Name, err)
		} else if vx.capacity != size {
			if err := h.deleteVol(ctx, zc, vol); err != nil && !errors.Is(err, hypervisors.ErrNotFound) {
				return fmt.Errorf("create seed %s: replace: %w", spec.Name, err)
			}
			found = false
		}
	}
	if !found {
		if vol, err = h.createRaw(ctx, zc, p, spec.Name, size); err != nil {
			return fmt.Errorf("create seed %s: %w", spec.Name, err)
		}
	}
	if err := h.upload(ctx, zc, vol, img); err != nil {
		return fmt.Errorf("create seed %s: %w", spec.Name, err)
	}
	if _, err := h.createRaw(ctx, zc, p, seedTag(spec.Name, lvspec.SeedIdentity(spec), size), 0); err != nil {
		return fmt.Errorf("create seed %s: identity tag: %w", spec.Name, err)
	}
	return nil
}

// uploadChunk is the most one upload stream packet carries; the upload can
// be aborted between two packets.
const uploadChunk = 128 << 10

// upload writes img into vol through one upload stream, bounded by
// UploadTimeout: the bytes go in chunks, and once the deadline has passed
// the next chunk fails instead, which makes go-libvirt send libvirt's
// stream abort. The daemon confirms the abort, the call returns a
// retryable error and the connection stays in use. Only an abort the
// daemon does not confirm within ProbeTimeout leaves the call to rpc's
// deadline (and the connection to the probe).
func (h *Hypervisor) upload(ctx context.Context, zc *zoneConn, vol golibvirt.StorageVol, img []byte) error {
	uctx, cancel := context.WithTimeout(ctx, h.cfg.UploadTimeout)
	defer cancel()
	// The call itself waits ProbeTimeout longer than the data, for the
	// abort's confirmation, whether the deadline passed or ctx ended.
	gctx, gcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer gcancel()
	stop := context.AfterFunc(uctx, func() { time.AfterFunc(h.cfg.ProbeTimeout, gcancel) })
	defer stop()
	r := &abortableReader{ctx: uctx, data: img, pace: h.uploadPace, chunk: uploadChunk}
	if h.uploadChunk > 0 {
		r.chunk = h.uploadChunk
	}
	op := "upload " + vol.Pool + "/" + vol.Name + " on " + zc.zone
	return zc.rpc(gctx, "StorageVolUpload", op, h.cfg.UploadTimeout+h.cfg.ProbeTimeout, func(l *golibvirt.Libvirt) error {
		return l.StorageVolUpload(vol, r, 0, uint64(len(img)), 0)
	})
}

// abortableReader hands out data in chunks until ctx ends, then fails.
type abortableReader struct {
	ctx  context.Context
	data []byte
	off  int
	// chunk is the most one Read returns.
	chunk int
	// pace, when set, runs before each chunk (tests slow an upload down).
	pace func(context.Context)
}

func (r *abortableReader) Read(p []byte) (int, error) {
	if r.pace != nil && r.off < len(r.data) {
		r.pace(r.ctx)
	}
	if err := r.ctx.Err(); err != nil {
		return 0, fmt.Errorf("upload aborted after %d of %d bytes: %w", r.off, len(r.data), err)
	}
	if r.off >= len(r.data) {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.chunk)], r.data[r.off:])
	r.off += n
	return n, nil
}

// readVolume reads what observation reports about one volume: format and
// backing format from its XML, a seed's identity from its tags.
func (h *Hypervisor) readVolume(ctx context.Context, zc *zoneConn, pool string, v golibvirt.StorageVol, tags []seedTagInfo) (*observed.Volume, uint64, error) {
	vx, err := h.volumeXML(ctx, zc, v)
	if err != nil {
		return nil, 0, err
	}
	ov := &observed.Volume{Zone: zc.zone, Pool: pool, Name: v.Name, Format: vx.format, BackingFormat: vx.backingFormat}
	if isSeedVolume(v.Name) {
		ov.Identity = seedIdentity(tags, vx.capacity)
	}
	return ov, vx.capacity, nil
}

// ReadVolumes implements hypervisors.VolumeReader: the pool is listed once
// and each named volume found there is read (a seed's identity from the
// listing).
func (h *Hypervisor) ReadVolumes(ctx context.Context, zone, pool string, names []string) ([]*observed.Volume, error) {
	zc, err := h.zone(zone)
	if err != nil {
		return nil, err
	}
	p, err := h.lookupPool(ctx, zc, pool)
	if err != nil {
		return nil, fmt.Errorf("read volumes in %s on %s: %w", pool, zone, err)
	}
	vols, listed, err := h.listVolumes(ctx, zc, p)
	if err != nil {
		return nil, fmt.Errorf("read volumes in %s on %s: %w", pool, zone, err)
	}
	tags := seedTags(listed)
	var out []*observed.Volume
	for _, name := range names {
		v, ok := vols[name]
		if !ok {
			continue
		}
		ov, _, err := h.readVolume(ctx, zc, pool, v, tags[name])
		if errors.Is(err, hypervisors.ErrNotFound) {
			continue
		} else if err != nil {
			return nil, fmt.Errorf("read volume %s: %w", name, err)
		}
		out = append(out, ov)
	}
	return out, nil
}

func (h *Hypervisor) createRaw(ctx context.Context, zc *zoneConn, p golibvirt.StoragePool, name string, size uint64) (golibvirt.StorageVol, error) {
	def, err := rawDefinition(name, size)
	if err != nil {
		return golibvirt.StorageVol{}, err
	}
	vol, err := rpcValue(ctx, zc, "StorageVolCreateXML", "create volume "+p.Name+"/"+name+" on "+zc.zone, 0, func(l *golibvirt.Libvirt) (golibvirt.StorageVol, error) {
		return l.StorageVolCreateXML(p, def, 0)
	})
	if errors.Is(err, hypervisors.ErrExists) {
		return h.lookupVolume(ctx, zc, p, name)
	}
	return vol, err
}

func (h *Hypervisor) deleteVol(ctx context.Context, zc *zoneConn, v golibvirt.StorageVol) error {
	return zc.rpc(ctx, "StorageVolDelete", "delete volume "+v.Pool+"/"+v.Name+" on "+zc.zone, 0, func(l *golibvirt.Libvirt) error {
		return l.StorageVolDelete(v, golibvirt.StorageVolDeleteNormal)
	})
}

// DeleteVolume implements lvspec.Steps: a missing volume is
// success, and the volume is verified gone. Only volumes named with
// lvspec.VolumePrefix are ever deleted (never a golden image). A seed's
// identity tags go first, even when the seed itself is gone.
func (h *Hypervisor) DeleteVolume(ctx context.Context, zone, pool, name string) error {
	zc, err := h.zone(zone)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(name, lvspec.VolumePrefix) {
		return fmt.Errorf("delete volume %s/%s on %s: %w", pool, name, zone, hypervisors.ErrNotOwned)
	}
	defer h.caches[zone].touchVolume(name)
	p, err := h.lookupPool(ctx, zc, pool)
	if err != nil {
		return fmt.Errorf("delete volume %s: %w", name, err)
	}
	if isSeedVolume(name) {
		vols, names, err := h.listVolumes(ctx, zc, p)
		if err == nil {
			err = h.dropSeedTags(ctx, zc, vols, names, name)
		}
		if err != nil {
			return fmt.Errorf("delete volume %s: %w", name, err)
		}
	}
	vol, err := h.lookupVolume(ctx, zc, p, name)
	if errors.Is(err, hypervisors.ErrNotFound) {
		return nil
	} else if err != nil {
		return fmt.Errorf("delete volume %s: %w", name, err)
	}
	if err := h.deleteVol(ctx, zc, vol); err != nil && !errors.Is(err, hypervisors.ErrNotFound) {
		return fmt.Errorf("delete volume %s: %w", name, err)
	}
	if _, err := h.lookupVolume(ctx, zc, p, name); err == nil {
		return fmt.Errorf("delete volume %s/%s on %s: still present: %w", pool, name, zone, hypervisors.ErrTransient)
	} else if !errors.Is(err, hypervisors.ErrNotFound) {
		return fmt.Errorf("delete volume %s: verify: %w", name, err)
	}
	return nil
}

// ---- domains ----

// DefineDomain implements lvspec.Steps. A domain of that name
// carrying our marker for the same machine is success; any other is
// ErrExists.
func (h *Hypervisor) DefineDomain(ctx context.Context, zone string, spec lvspec.DomainSpec) error {
	zc, err := h.zone(zone)
	if err != nil {
		return err
	}
	if spec.Marker.Installation != h.cfg.Installation {
		return fmt.Errorf("define %s on %s: marker names installation %q, not ours: %w", spec.Name, zone, spec.Marker.Installation, hypervisors.ErrInvalid)
	}
	def, err := domainDefinition(spec)
	if err != nil {
		return err
	}
	defer h.caches[zone].touch(spec.Name)
	h.setOwner(zone, spec.Name, spec.Marker.MachineID)
	if done, err := h.adoptDomain(ctx, zc, spec); done || err != nil {
		return err
	}
	err = zc.rpc(ctx, "DomainDefineXMLFlags", "define "+spec.Name+" on "+zone, 0, func(l *golibvirt.Libvirt) error {
		_, err := l.DomainDefineXMLFlags(def, 0)
		return err
	})
	if err == nil {
		return nil
	}
	// A concurrent define may have won; adopt it if it is ours.
	if done, aerr := h.adoptDomain(ctx, zc, spec); done || aerr != nil {
		return aerr
	}
	return fmt.Errorf("define %s on %s: %w", spec.Name, zone, err)
}

// adoptDomain reports done when a domain named spec.Name exists and is
// ours for spec's machine, and ErrExists when it exists but is not.
func (h *Hypervisor) adoptDomain(ctx context.Context, zc *zoneConn, spec lvspec.DomainSpec) (bool, error) {
	dom, err := h.lookupDomain(ctx, zc, spec.Name)
	if errors.Is(err, hypervisors.ErrNotFound) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("define %s on %s: %w", spec.Name, zc.zone, err)
	}
	d, err := h.domainXML(ctx, zc, dom)
	if err != nil {
		return false, fmt.Errorf("define %s on %s: %w", spec.Name, zc.zone, err)
	}
	m := d.marker()
	if m == nil || m.Installation != spec.Marker.Installation || m.MachineID != spec.Marker.MachineID {
		return false, fmt.Errorf("define %s on %s: name taken by a domain we do not own for this machine: %w", spec.Name, zc.zone, hypervisors.ErrExists)
	}
	return true, nil
}

// UndefineDomain implements lvspec.Steps. A missing domain is
// success; a domain without our marker is ErrNotOwned. A running domain is
// powered off first, so no transient domain is left behind.
func (h *Hypervisor) UndefineDomain(ctx context.Context, t hypervisors.Target) error {
	zc, err := h.zone(t.Zone)
	if err != nil {
		return err
	}
	defer h.caches[t.Zone].touch(t.Name)
	dom, found, err := h.ownedDomain(ctx, zc, t.Name)
	if err != nil || !found {
		return wrapf(err, "undefine %s", t.Name)
	}
	st, err := h.domainState(ctx, zc, dom)
	if err != nil && !errors.Is(err, hypervisors.ErrNotFound) {
		return fmt.Errorf("undefine %s: %w", t.Name, err)
	}
	if err == nil && st != golibvirt.DomainShutoff {
		if err := h.destroy(ctx, zc, dom); err != nil {
			return fmt.Errorf("undefine %s: %w", t.Name, err)
		}
	}
	op := "undefine " + t.Name + " on " + t.Zone
	err = zc.rpc(ctx, "DomainUndefineFlags", op, 0, func(l *golibvirt.Libvirt) error {
		return l.DomainUndefineFlags(dom, golibvirt.DomainUndefineManagedSave|golibvirt.DomainUndefineNvram)
	})
	if errors.Is(err, hypervisors.ErrUnsupported) || errors.Is(err, hypervisors.ErrInvalid) {
		// Hosts (and the test driver) that reject the NVRAM flag.
		err = zc.rpc(ctx, "DomainUndefineFlags", op, 0, func(l *golibvirt.Libvirt) error {
			return l.DomainUndefineFlags(dom, golibvirt.DomainUndefineManagedSave)
		})
		if errors.Is(err, hypervisors.ErrUnsupported) || errors.Is(err, hypervisors.ErrInvalid) {
			err = zc.rpc(ctx, "DomainUndefine", op, 0, func(l *golibvirt.Libvirt) error { return l.DomainUndefine(dom) })
		}
	}
	if err != nil && !errors.Is(err, hypervisors.ErrNotFound) {
		return fmt.Errorf("undefine %s: %w", t.Name, err)
	}
	return nil
}

// destroy powers a domain off; "not running" is success.
func (h *Hypervisor) destroy(ctx context.Context, zc *zoneConn, dom golibvirt.Domain) error {
	err := zc.rpc(ctx, "DomainDestroy", "destroy "+dom.Name+" on "+zc.zone, 0, func(l *golibvirt.Libvirt) error {
		return l.DomainDestroy(dom)
	})
	if err != nil && isCode(err, golibvirt.ErrOperationInvalid) {
		return nil // already shut off
	}
	return err
}

// Start implements hypervisors.Hypervisor: start a shut-off or crashed
// domain, resume a paused one, no-op on a running one.
func (h *Hypervisor) Start(ctx context.Context, t hypervisors.Target) error {
	zc, err := h.zone(t.Zone)
	if err != nil {
		return err
	}
	defer h.caches[t.Zone].touch(t.Name)
	dom, err := h.lookupDomain(ctx, zc, t.Name)
	if err != nil {
		return fmt.Errorf("start %s: %w", t.Name, err)
	}
	st, reason, err := h.domainStateReason(ctx, zc, dom)
	if err != nil {
		return fmt.Errorf("start %s: %w", t.Name, err)
	}
	switch st {
	case golibvirt.DomainRunning, golibvirt.DomainBlocked:
		return nil
	case golibvirt.DomainPaused:
		if golibvirt.DomainPausedReason(reason) == golibvirt.DomainPausedStartingUp {
			// libvirtd is still starting it (a start that outlived its
			// call's deadline, or one a crashed provider began): resuming
			// would only wait for that start's job and then be refused.
			return fmt.Errorf("start %s: libvirtd is still starting the domain: %w", t.Name, hypervisors.ErrTransient)
		}
		fallthrough
	case golibvirt.DomainPmsuspended:
		err = zc.rpc(ctx, "DomainResume", "resume "+t.Name+" on "+t.Zone, 0, func(l *golibvirt.Libvirt) error { return l.DomainResume(dom) })
	case golibvirt.DomainShutdown:
		return fmt.Errorf("start %s: domain is shutting down: %w", t.Name, hypervisors.ErrTransient)
	default:
		err = zc.rpc(ctx, "DomainCreate", "create "+t.Name+" on "+t.Zone, 0, func(l *golibvirt.Libvirt) error { return l.DomainCreate(dom) })
	}
	if err != nil && isCode(err, golibvirt.ErrOperationInvalid) {
		// Raced with another start or resume ("domain is already
		// running"), e.g. libvirtd finishing a start that a crashed
		// provider began while the domain was still paused for start-up:
		// fine if it is running now. When the state cannot be read, the
		// refusal proves nothing: retry rather than fail the machine.
		st, serr := h.domainState(ctx, zc, dom)
		switch {
		case serr == nil && (st == golibvirt.DomainRunning || st == golibvirt.DomainBlocked):
			return nil
		case serr != nil:
			return fmt.Errorf("start %s: refused (%v), and its state could not be read again: %w", t.Name, err, serr)
		}
	}
	if err != nil {
		return fmt.Errorf("start %s: %w", t.Name, err)
	}
	return nil
}

// Resume implements hypervisors.Hypervisor (same as Start).
func (h *Hypervisor) Resume(ctx context.Context, t hypervisors.Target) error { return h.Start(ctx, t) }

// Stop implements hypervisors.Hypervisor: ACPI/agent shutdown, polled for
// at most grace, then a hard power-off. Missing or stopped is success; a
// domain without our marker is ErrNotOwned.
func (h *Hypervisor) Stop(ctx context.Context, t hypervisors.Target, grace time.Duration) error {
	zc, err := h.zone(t.Zone)
	if err != nil {
		return err
	}
	defer h.caches[t.Zone].touch(t.Name)
	dom, found, err := h.ownedDomain(ctx, zc, t.Name)
	if err != nil || !found {
		return wrapf(err, "stop %s", t.Name)
	}
	st, err := h.domainState(ctx, zc, dom)
	if err != nil {
		return fmt.Errorf("stop %s: %w", t.Name, err)
	}
	if st == golibvirt.DomainShutoff {
		return nil
	}
	if grace > 0 && st != golibvirt.DomainPaused && st != golibvirt.DomainPmsuspended {
		err := zc.rpc(ctx, "DomainShutdown", "shutdown "+t.Name+" on "+t.Zone, 0, func(l *golibvirt.Libvirt) error { return l.DomainShutdown(dom) })
		if err == nil {
			deadline := time.Now().Add(grace)
			b := retry.Poll.Backoff() // the state is polled until grace ends
			for time.Now().Before(deadline) {
				select {
				case <-ctx.Done():
					return fmt.Errorf("stop %s: %w: %w", t.Name, hypervisors.ErrTransient, ctx.Err())
				case <-time.After(min(b.Next(), time.Until(deadline))):
				}
				st, err := h.domainState(ctx, zc, dom)
				if errors.Is(err, hypervisors.ErrNotFound) {
					return nil
				}
				if err == nil && st == golibvirt.DomainShutoff {
					return nil
				}
			}
		} else {
			h.log.Debug("graceful shutdown refused, powering off", "zone", t.Zone, "vm", t.Name, "err", err)
		}
	}
	if err := h.destroy(ctx, zc, dom); err != nil && !errors.Is(err, hypervisors.ErrNotFound) {
		return fmt.Errorf("stop %s: %w", t.Name, err)
	}
	return nil
}

// SetAutostart implements hypervisors.Hypervisor.
func (h *Hypervisor) SetAutostart(ctx context.Context, t hypervisors.Target, on bool) error {
	zc, err := h.zone(t.Zone)
	if err != nil {
		return err
	}
	dom, err := h.lookupDomain(ctx, zc, t.Name)
	if err != nil {
		return fmt.Errorf("autostart %s: %w", t.Name, err)
	}
	v := int32(0)
	if on {
		v = 1
	}
	if err := zc.rpc(ctx, "DomainSetAutostart", "autostart "+t.Name+" on "+t.Zone, 0, func(l *golibvirt.Libvirt) error {
		return l.DomainSetAutostart(dom, v)
	}); err != nil {
		return fmt.Errorf("autostart %s: %w", t.Name, err)
	}
	return nil
}

// SetMarker implements hypervisors.Hypervisor: the metadata element is
// written to the persistent definition and, when running, the live one.
// The existing marker must name this installation and the same machine.
func (h *Hypervisor) SetMarker(ctx context.Context, t hypervisors.Target, m observed.Marker) error {
	zc, err := h.zone(t.Zone)
	if err != nil {
		return err
	}
	if m.Installation != h.cfg.Installation || m.MachineID == "" {
		return fmt.Errorf("set marker on %s: marker must name installation %q and a machine: %w", t.Name, h.cfg.Installation, hypervisors.ErrInvalid)
	}
	defer h.caches[t.Zone].touch(t.Name)
	dom, err := h.lookupDomain(ctx, zc, t.Name)
	if err != nil {
		return fmt.Errorf("set marker on %s: %w", t.Name, err)
	}
	old, err := h.checkOwned(ctx, zc, dom)
	if err != nil {
		return fmt.Errorf("set marker on %s: %w", t.Name, err)
	}
	if old.MachineID != m.MachineID {
		return fmt.Errorf("set marker on %s: domain belongs to machine %q: %w", t.Name, old.MachineID, hypervisors.ErrNotOwned)
	}
	body, err := markerBody(m)
	if err != nil {
		return err
	}
	st, err := h.domainState(ctx, zc, dom)
	if err != nil {
		return fmt.Errorf("set marker on %s: %w", t.Name, err)
	}
	flags := golibvirt.DomainAffectConfig
	if st != golibvirt.DomainShutoff {
		flags |= golibvirt.DomainAffectLive
	}
	err = zc.rpc(ctx, "DomainSetMetadata", "set marker on "+t.Name+" on "+t.Zone, 0, func(l *golibvirt.Libvirt) error {
		return l.DomainSetMetadata(dom, int32(golibvirt.DomainMetadataElement),
			golibvirt.OptString{body}, golibvirt.OptString{nsPrefix}, golibvirt.OptString{Namespace}, flags)
	})
	if err != nil && flags&golibvirt.DomainAffectLive != 0 && isCode(err, golibvirt.ErrOperationInvalid) {
		// Stopped between the state read and the write.
		err = zc.rpc(ctx, "DomainSetMetadata", "set marker on "+t.Name+" on "+t.Zone, 0, func(l *golibvirt.Libvirt) error {
			return l.DomainSetMetadata(dom, int32(golibvirt.DomainMetadataElement),
				golibvirt.OptString{body}, golibvirt.OptString{nsPrefix}, golibvirt.OptString{Namespace}, golibvirt.DomainAffectConfig)
		})
	}
	if err != nil {
		return fmt.Errorf("set marker on %s: %w", t.Name, err)
	}
	return nil
}
