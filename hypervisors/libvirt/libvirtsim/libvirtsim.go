package libvirtsim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
	"github.com/bigfleet-vm/provider/observed"
)

// Libvirt simulates a set of libvirt hosts (one per zone), each with
// storage pools, networks and domains, behind hypervisors.Hypervisor and
// lvspec.Steps.
type Libvirt struct {
	simcore.Surface // the calls every simulator answers alike
	c               *simcore.Core
	opts            Options

	zones []string
	hosts map[string]*lvHost
}

var (
	_ hypervisors.Hypervisor     = (*Libvirt)(nil)
	_ lvspec.Steps               = (*Libvirt)(nil)
	_ hypervisors.HealthReporter = (*Libvirt)(nil)
	_ hypervisors.VolumeReader   = (*Libvirt)(nil)
	_ hypervisors.CapacityReader = (*Libvirt)(nil)
	_ hypervisors.Simulator      = (*Libvirt)(nil)
)

// Defaults applied by NewLibvirt to zero Options fields.
const (
	DefaultPool         = "default"
	DefaultImage        = "golden.qcow2"
	DefaultImageFormat  = "qcow2"
	DefaultImageSizeGiB = 10
	DefaultNetwork      = "default"
)

// Options configure a simulated host set: the settings every simulator
// shares (simcore.Options, embedded) and the hosts' own. The zero value is
// usable.
type Options struct {
	simcore.Options

	// Pool is the storage pool every host has (default "default"), Image
	// the base image volume pre-existing in it (default "golden.qcow2"),
	// ImageFormat its format (default "qcow2"; "raw" is the other choice)
	// and ImageSizeGiB its virtual size (default 10).
	Pool         string
	Image        string
	ImageFormat  string
	ImageSizeGiB int
	// Network is the network every host has (default "default").
	Network string
}

type lvHost struct {
	Networks []string                      `json:"networks"`
	Pools    map[string]map[string]*volume `json:"pools"`
	Domains  map[string]*domain            `json:"domains"`
}

type volume struct {
	Name          string `json:"name"`
	Format        string `json:"format"`
	CapacityGiB   int    `json:"capacity_gib"`
	Backing       string `json:"backing,omitempty"`
	BackingFormat string `json:"backing_format,omitempty"`
	Seed          *seed  `json:"seed,omitempty"`
}

// seed is the content of a NoCloud ISO.
type seed struct {
	InstanceID string `json:"instance_id"`
	Hostname   string `json:"hostname"`
	UserData   string `json:"user_data,omitempty"`
}

type domain struct {
	Name       string           `json:"name"`
	DomainType string           `json:"domain_type,omitempty"`
	VCPU       int              `json:"vcpu"`
	MemoryMiB  int              `json:"memory_mib"`
	Pool       string           `json:"pool"`
	Disks      []string         `json:"disks,omitempty"`
	Network    string           `json:"network,omitempty"`
	Kernel     string           `json:"kernel,omitempty"`
	Initrd     string           `json:"initrd,omitempty"`
	Cmdline    string           `json:"cmdline,omitempty"`
	Marker     *observed.Marker `json:"marker,omitempty"`
	Autostart  bool             `json:"autostart,omitempty"`
	simcore.Machine
}

// NewLibvirt returns a fresh simulated host set: every zone has the pool
// opts.Pool holding the base image opts.Image, the network opts.Network,
// and no domains. With opts.Store every change is journaled there.
func NewLibvirt(opts Options) *Libvirt {
	opts = withDefaults(opts)
	f := &Libvirt{opts: opts, zones: opts.Zones, hosts: map[string]*lvHost{}}
	f.c = simcore.New(opts.Options, simcore.Machines{Find: f.machineOf, Save: f.saveMachine})
	f.Surface = simcore.NewSurface(f.c, &f.zones)
	for _, z := range opts.Zones {
		f.hosts[z] = f.newHost()
	}
	return f
}

// OpenLibvirt is NewLibvirt plus the domains and volumes persisted in
// opts.State (zones only the state knows are added). With opts.ReadOnly
// every mutating call fails with ErrPermission (provider plan offline).
func OpenLibvirt(opts Options) (*Libvirt, error) {
	f := NewLibvirt(opts)
	var loaded []string
	host := func(zone string) *lvHost {
		if f.hosts[zone] == nil {
			f.hosts[zone] = f.newHost()
			loaded = append(loaded, zone)
		}
		return f.hosts[zone]
	}
	err := f.c.Persisted(keyDomain, func(key string, raw []byte) error {
		zone, name, ok := strings.Cut(strings.TrimPrefix(key, keyDomain), "/")
		d := &domain{}
		if err := json.Unmarshal(raw, d); err != nil || !ok || d.Name != name {
			return fmt.Errorf("bad domain record: %v", err)
		}
		host(zone).Domains[name] = d
		return nil
	})
	if err == nil {
		err = f.c.Persisted(keyVolume, func(key string, raw []byte) error {
			parts := strings.SplitN(strings.TrimPrefix(key, keyVolume), "/", 3)
			v := &volume{}
			if err := json.Unmarshal(raw, v); err != nil || len(parts) != 3 || v.Name != parts[2] {
				return fmt.Errorf("bad volume record: %v", err)
			}
			h := host(parts[0])
			if h.Pools[parts[1]] == nil {
				h.Pools[parts[1]] = map[string]*volume{}
			}
			h.Pools[parts[1]][v.Name] = v
			return nil
		})
	}
	if err != nil {
		return nil, err
	}
	f.zones = simcore.MergeZones(f.zones, loaded)
	return f, nil
}

// withDefaults applies the shared defaults and the host set's own.
func withDefaults(o Options) Options {
	o.Options = o.Options.WithDefaults()
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&o.Pool, DefaultPool)
	def(&o.Image, DefaultImage)
	def(&o.ImageFormat, DefaultImageFormat)
	def(&o.Network, DefaultNetwork)
	if o.ImageSizeGiB == 0 {
		o.ImageSizeGiB = DefaultImageSizeGiB
	}
	return o
}

// Keys of the journaled world: a domain per zone and name, a volume per
// zone, pool and name.
const (
	keyDomain = "lv/domain/"
	keyVolume = "lv/volume/"
)

// saveDomain journals a domain as it is now (or its removal). Callers hold
// the world lock.
func (f *Libvirt) saveDomain(zone, name string) {
	var d *domain
	if h := f.hosts[zone]; h != nil {
		d = h.Domains[name]
	}
	f.c.Persist(keyDomain+zone+"/"+name, d)
}

// saveVolumes journals volumes as they are now (or their removal).
// Callers hold the world lock.
func (f *Libvirt) saveVolumes(zone, pool string, names ...string) {
	for _, name := range names {
		var v *volume
		if h := f.hosts[zone]; h != nil {
			v = h.Pools[pool][name]
		}
		f.c.Persist(keyVolume+zone+"/"+pool+"/"+name, v)
	}
}

func (f *Libvirt) newHost() *lvHost {
	o := f.opts
	return &lvHost{
		Networks: []string{o.Network},
		Pools: map[string]map[string]*volume{o.Pool: {
			o.Image: {Name: o.Image, Format: o.ImageFormat, CapacityGiB: o.ImageSizeGiB},
		}},
		Domains: map[string]*domain{},
	}
}

// Apply performs one libvirt step.
func (f *Libvirt) Apply(ctx context.Context, t hypervisors.Target, p hypervisors.StepParams) (int, error) {
	return lvspec.Apply(ctx, f, t, p)
}

// AddForeign implements hypervisors.Simulator: it defines a domain named
// t.Name that this installation does not own.
func (f *Libvirt) AddForeign(t hypervisors.Target) error { return f.AddForeignVM(t.Zone, t.Name, nil) }

// AddOwned implements hypervisors.Simulator: it defines a running domain
// named t.Name that carries m.
func (f *Libvirt) AddOwned(t hypervisors.Target, m observed.Marker) error {
	return f.AddOwnedVM(t.Zone, t.Name, m, observed.PowerRunning)
}

// host returns a zone's host; the caller holds the world lock.
func (f *Libvirt) host(zone string) (*lvHost, error) {
	h := f.hosts[zone]
	if h == nil {
		return nil, fmt.Errorf("unknown libvirt host %q: %w", zone, hypervisors.ErrInvalid)
	}
	return h, nil
}

// pool is the pool name on host zone; the world lock is held.
func (f *Libvirt) pool(zone, name string) (map[string]*volume, error) {
	h, err := f.host(zone)
	if err != nil {
		return nil, err
	}
	return h.pool(zone, name)
}

func (h *lvHost) pool(zone, name string) (map[string]*volume, error) {
	p := h.Pools[name]
	if p == nil {
		return nil, fmt.Errorf("storage pool %q not found on %s: %w", name, zone, hypervisors.ErrNotFound)
	}
	return p, nil
}

// changeDomain runs change on the domain behind t with the world locked,
// once the call is accounted for (enterWrite); what names the call in
// errors ("set marker").
func (f *Libvirt) changeDomain(ctx context.Context, call, what string, t hypervisors.Target, change func(*lvHost, *domain) error) error {
	if err := f.c.EnterWrite(ctx, call, t.Zone, t); err != nil {
		return err
	}
	f.c.Lock()
	defer f.c.Unlock()
	h, d, err := f.domain(t)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return change(h, d)
}

func (f *Libvirt) domain(t hypervisors.Target) (*lvHost, *domain, error) {
	h, err := f.host(t.Zone)
	if err != nil {
		return nil, nil, err
	}
	d := h.Domains[t.Name]
	if d == nil {
		return h, nil, fmt.Errorf("domain %q not found on %s: %w", t.Name, t.Zone, hypervisors.ErrNotFound)
	}
	return h, d, nil
}

func (f *Libvirt) machineOf(t hypervisors.Target) (*simcore.Machine, *observed.Marker, error) {
	_, d, err := f.domain(t)
	if err != nil {
		return nil, nil, err
	}
	return &d.Machine, d.Marker, nil
}

func (d *domain) observe(zone string) *observed.VM {
	return &observed.VM{
		Zone:      zone,
		Name:      d.Name,
		Marker:    simcore.CloneMarker(d.Marker),
		Power:     d.Power,
		VCPU:      d.VCPU,
		MemoryMiB: d.MemoryMiB,
		Autostart: d.Autostart,
		Volumes:   append([]string(nil), d.Disks...),
	}
}

// Observe lists a host's domains (sorted by name) and the volumes in
// opts.Pool whose names carry lvspec.VolumePrefix (so VolumesAt is
// set).
func (f *Libvirt) Observe(ctx context.Context, zone string) (*observed.Zone, error) {
	if err := f.c.Enter(ctx, "Observe", zone, hypervisors.Target{Zone: zone}); err != nil {
		return nil, err
	}
	f.c.Lock()
	defer f.c.Unlock()
	h, err := f.host(zone)
	if err != nil {
		return nil, fmt.Errorf("observe %s: %w", zone, err)
	}
	now := f.c.Now()
	z := &observed.Zone{Name: zone, Status: observed.StatusOK, At: now, VolumesAt: now}
	for _, d := range h.Domains {
		z.VMs = append(z.VMs, d.observe(zone))
	}
	sort.Slice(z.VMs, func(i, j int) bool { return z.VMs[i].Name < z.VMs[j].Name })
	for _, v := range h.Pools[f.opts.Pool] {
		if strings.HasPrefix(v.Name, lvspec.VolumePrefix) {
			z.Volumes = append(z.Volumes, v.observe(zone, f.opts.Pool))
		}
	}
	sort.Slice(z.Volumes, func(i, j int) bool { return z.Volumes[i].Name < z.Volumes[j].Name })
	return z, nil
}

// observe reports a volume as the libvirt adapter does: a seed's identity
// is that of the content it holds, "" for a seed volume with no content
// (created, never uploaded).
func (v *volume) observe(zone, pool string) *observed.Volume {
	ov := &observed.Volume{Zone: zone, Pool: pool, Name: v.Name, Format: v.Format, BackingFormat: v.BackingFormat}
	if v.Seed != nil {
		ov.Identity = lvspec.SeedIdentity(lvspec.SeedSpec{InstanceID: v.Seed.InstanceID, Hostname: v.Seed.Hostname, UserData: v.Seed.UserData})
	}
	return ov
}

// ReadVolumes implements hypervisors.VolumeReader.
func (f *Libvirt) ReadVolumes(ctx context.Context, zone, pool string, names []string) ([]*observed.Volume, error) {
	if err := f.c.Enter(ctx, "ReadVolumes", zone, hypervisors.Target{Zone: zone}); err != nil {
		return nil, err
	}
	f.c.Lock()
	defer f.c.Unlock()
	p, err := f.pool(zone, pool)
	if err != nil {
		return nil, fmt.Errorf("read volumes on %s: %w", zone, err)
	}
	var out []*observed.Volume
	for _, n := range names {
		if v := p[n]; v != nil {
			out = append(out, v.observe(zone, pool))
		}
	}
	return out, nil
}

// AddBlankSeedVolume places a seed volume with no content, as a crash
// between creating the volume and uploading the ISO leaves it.
func (f *Libvirt) AddBlankSeedVolume(zone, pool, name string) error {
	f.c.Lock()
	defer f.c.Unlock()
	p, err := f.pool(zone, pool)
	if err != nil {
		return err
	}
	if p[name] != nil {
		return fmt.Errorf("add %s/%s on %s: %w", pool, name, zone, hypervisors.ErrExists)
	}
	p[name] = &volume{Name: name, Format: "iso", CapacityGiB: 1}
	f.saveVolumes(zone, pool, name)
	return nil
}

// Lookup re-reads one domain by name.
func (f *Libvirt) Lookup(ctx context.Context, t hypervisors.Target) (*observed.VM, error) {
	if err := f.c.Enter(ctx, "Lookup", t.Zone, t); err != nil {
		return nil, err
	}
	f.c.Lock()
	defer f.c.Unlock()
	_, d, err := f.domain(t)
	if err != nil {
		return nil, fmt.Errorf("lookup: %w", err)
	}
	return d.observe(t.Zone), nil
}

// ensureVolume creates a volume or accepts an existing one of ours that
// has the same format and backing. The caller holds the world lock.
func (f *Libvirt) ensureVolume(zone, poolName string, pool map[string]*volume, want *volume) error {
	have := pool[want.Name]
	if have == nil {
		pool[want.Name] = want
		f.saveVolumes(zone, poolName, want.Name)
		return nil
	}
	if !strings.HasPrefix(have.Name, lvspec.VolumePrefix) {
		return fmt.Errorf("volume %q on %s exists and is not ours: %w", want.Name, zone, hypervisors.ErrExists)
	}
	if have.Format != want.Format || have.Backing != want.Backing {
		return fmt.Errorf("volume %q on %s exists as %s backed by %q, want %s backed by %q: %w",
			want.Name, zone, have.Format, have.Backing, want.Format, want.Backing, hypervisors.ErrExists)
	}
	if want.CapacityGiB > have.CapacityGiB {
		have.CapacityGiB = want.CapacityGiB
		f.saveVolumes(zone, poolName, want.Name)
	}
	if want.Seed != nil {
		have.Seed = want.Seed
		f.saveVolumes(zone, poolName, want.Name)
	}
	return nil
}

// CreateOverlay ensures a qcow2 volume backed by the base image, declaring
// the base image's real format as the backing format.
func (f *Libvirt) CreateOverlay(ctx context.Context, zone string, spec lvspec.OverlaySpec) error {
	return f.ensureIn(ctx, "CreateOverlay", "create overlay", zone, spec.Pool, spec.Name, func(pool map[string]*volume) error {
		base := pool[spec.BaseImage]
		if base == nil {
			return fmt.Errorf("base image %q not found in pool %s: %w", spec.BaseImage, spec.Pool, hypervisors.ErrNotFound)
		}
		return f.ensureVolume(zone, spec.Pool, pool, &volume{
			Name:          spec.Name,
			Format:        "qcow2",
			CapacityGiB:   max(base.CapacityGiB, spec.MinCapacityGiB),
			Backing:       base.Name,
			BackingFormat: base.Format,
		})
	})
}

// CreateSeed ensures a NoCloud ISO volume.
func (f *Libvirt) CreateSeed(ctx context.Context, zone string, spec lvspec.SeedSpec) error {
	return f.ensureIn(ctx, "CreateSeed", "create seed", zone, spec.Pool, spec.Name, func(pool map[string]*volume) error {
		return f.ensureVolume(zone, spec.Pool, pool, &volume{
			Name:        spec.Name,
			Format:      "iso",
			CapacityGiB: 1,
			Seed:        &seed{InstanceID: spec.InstanceID, Hostname: spec.Hostname, UserData: spec.UserData},
		})
	})
}

// ensureIn runs a volume ensure: it accounts for the call, refuses a
// read-only world and an empty name, and runs ensure on the zone's pool
// under the world lock; op names it in errors ("create seed").
func (f *Libvirt) ensureIn(ctx context.Context, call, op, zone, poolName, name string, ensure func(map[string]*volume) error) error {
	if err := f.c.EnterWrite(ctx, call, zone, hypervisors.Target{Zone: zone, Name: name}); err != nil {
		return err
	}
	if name == "" {
		return fmt.Errorf("%s on %s: empty name: %w", op, zone, hypervisors.ErrInvalid)
	}
	f.c.Lock()
	defer f.c.Unlock()
	h, err := f.host(zone)
	if err == nil {
		var pool map[string]*volume
		if pool, err = h.pool(zone, poolName); err == nil {
			err = ensure(pool)
		}
	}
	if err != nil {
		return fmt.Errorf("%s %s on %s: %w", op, name, zone, err)
	}
	return nil
}

// DefineDomain defines a domain or, when one of that name carries the
// same installation and machine in its marker, redefines it (power,
// autostart and guest are kept).
func (f *Libvirt) DefineDomain(ctx context.Context, zone string, spec lvspec.DomainSpec) error {
	if err := f.c.EnterWrite(ctx, "DefineDomain", zone, hypervisors.Target{Zone: zone, Name: spec.Name}); err != nil {
		return err
	}
	if err := f.c.CreateFault("define "+spec.Name, spec.Labels); err != nil {
		return err
	}
	switch {
	case spec.Name == "" || spec.VCPU <= 0 || spec.MemoryMiB <= 0:
		return fmt.Errorf("define %q on %s: name, vcpu and memory are required: %w", spec.Name, zone, hypervisors.ErrInvalid)
	case spec.Marker.Installation == "" || spec.Marker.MachineID == "":
		return fmt.Errorf("define %s on %s: marker without installation or machine id: %w", spec.Name, zone, hypervisors.ErrInvalid)
	case spec.Overlay == "":
		return fmt.Errorf("define %s on %s: no overlay disk: %w", spec.Name, zone, hypervisors.ErrInvalid)
	}
	f.c.Lock()
	defer f.c.Unlock()
	err := func() error {
		h, err := f.host(zone)
		if err != nil {
			return err
		}
		pool, err := h.pool(zone, spec.Pool)
		if err != nil {
			return err
		}
		disks := []string{spec.Overlay}
		if spec.Seed != "" {
			disks = append(disks, spec.Seed)
		}
		for _, v := range disks {
			if pool[v] == nil {
				return fmt.Errorf("volume %q not found in pool %s: %w", v, spec.Pool, hypervisors.ErrNotFound)
			}
		}
		marker := spec.Marker
		d := h.Domains[spec.Name]
		if d == nil {
			d = &domain{Name: spec.Name, Machine: simcore.Machine{Power: observed.PowerStopped}}
			h.Domains[spec.Name] = d
		} else if !simcore.SameOwner(d.Marker, &marker) {
			return fmt.Errorf("domain %q exists and is not this machine's: %w", spec.Name, hypervisors.ErrExists)
		}
		d.DomainType, d.VCPU, d.MemoryMiB = spec.DomainType, spec.VCPU, spec.MemoryMiB
		d.Pool, d.Disks, d.Network = spec.Pool, disks, spec.Network
		d.Kernel, d.Initrd, d.Cmdline = spec.Kernel, spec.Initrd, spec.Cmdline
		d.Marker = &marker
		f.saveDomain(zone, spec.Name)
		return nil
	}()
	if err != nil {
		return fmt.Errorf("define %s on %s: %w", spec.Name, zone, err)
	}
	return nil
}

// UndefineDomain removes a stopped domain's definition (its volumes stay).
// A missing domain is success; a running or paused one is ErrInvalid.
func (f *Libvirt) UndefineDomain(ctx context.Context, t hypervisors.Target) error {
	if err := f.c.EnterWrite(ctx, "UndefineDomain", t.Zone, t); err != nil {
		return err
	}
	f.c.Lock()
	defer f.c.Unlock()
	h, d, err := f.domain(t)
	if errors.Is(err, hypervisors.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("undefine: %w", err)
	}
	if d.Power == observed.PowerRunning || d.Power == observed.PowerPaused {
		return fmt.Errorf("undefine %s: domain is %s, stop it first: %w", simcore.TargetName(t), d.Power, hypervisors.ErrInvalid)
	}
	delete(h.Domains, t.Name)
	f.saveDomain(t.Zone, t.Name)
	return nil
}

// DeleteVolume deletes one of our volumes; a missing one is success. A
// volume without our prefix is ErrNotOwned, one attached to a running or
// paused domain ErrInvalid.
func (f *Libvirt) DeleteVolume(ctx context.Context, zone, pool, name string) error {
	if err := f.c.EnterWrite(ctx, "DeleteVolume", zone, hypervisors.Target{Zone: zone, Name: name}); err != nil {
		return err
	}
	f.c.Lock()
	defer f.c.Unlock()
	err := func() error {
		h, err := f.host(zone)
		if err != nil {
			return err
		}
		p, err := h.pool(zone, pool)
		if err != nil {
			return err
		}
		if p[name] == nil {
			return nil
		}
		if !strings.HasPrefix(name, lvspec.VolumePrefix) {
			return fmt.Errorf("volume %q is not ours: %w", name, hypervisors.ErrNotOwned)
		}
		for _, d := range h.Domains {
			if d.Pool == pool && slices.Contains(d.Disks, name) &&
				(d.Power == observed.PowerRunning || d.Power == observed.PowerPaused) {
				return fmt.Errorf("volume %q is in use by %s domain %s: %w", name, d.Power, d.Name, hypervisors.ErrInvalid)
			}
		}
		delete(p, name)
		f.saveVolumes(zone, pool, name)
		return nil
	}()
	if err != nil {
		return fmt.Errorf("delete volume %s/%s on %s: %w", pool, name, zone, err)
	}
	return nil
}

// Start boots a domain (a paused one is resumed; a running one is left
// alone). It fails with ErrNotFound when a disk, its backing image or the
// network is gone.
func (f *Libvirt) Start(ctx context.Context, t hypervisors.Target) error {
	return f.changeDomain(ctx, "Start", "start", t, func(h *lvHost, d *domain) error {
		if d.Power == observed.PowerRunning {
			return nil
		}
		if d.Power != observed.PowerPaused {
			pool := h.Pools[d.Pool]
			for _, name := range d.Disks {
				v := pool[name]
				if v == nil {
					return fmt.Errorf("start %s: cannot access storage file %s/%s: %w", simcore.TargetName(t), d.Pool, name, hypervisors.ErrNotFound)
				}
				if v.Backing != "" && pool[v.Backing] == nil {
					return fmt.Errorf("start %s: cannot access backing file %s of %s: %w", simcore.TargetName(t), v.Backing, name, hypervisors.ErrNotFound)
				}
			}
			if d.Network != "" && !slices.Contains(h.Networks, d.Network) {
				return fmt.Errorf("start %s: network %q not found: %w", simcore.TargetName(t), d.Network, hypervisors.ErrNotFound)
			}
		}
		d.PowerOn(f.c.Now())
		f.saveDomain(t.Zone, t.Name)
		return nil
	})
}

// Resume resumes a paused domain; a running one is left alone, a stopped
// one is ErrInvalid.
func (f *Libvirt) Resume(ctx context.Context, t hypervisors.Target) error {
	return f.changeDomain(ctx, "Resume", "resume", t, func(_ *lvHost, d *domain) error {
		switch d.Power {
		case observed.PowerRunning:
			return nil
		case observed.PowerPaused:
			d.PowerOn(f.c.Now())
			f.saveDomain(t.Zone, t.Name)
			return nil
		}
		return fmt.Errorf("resume %s: domain is %s: %w", simcore.TargetName(t), d.Power, hypervisors.ErrInvalid)
	})
}

// Stop shuts a domain down. A running guest honours the ACPI request at
// once; a paused guest cannot, so it is powered off after grace. A stopped,
// crashed or missing domain is success.
func (f *Libvirt) Stop(ctx context.Context, t hypervisors.Target, grace time.Duration) error {
	if err := f.c.EnterWrite(ctx, "Stop", t.Zone, t); err != nil {
		return err
	}
	f.c.Lock()
	_, d, err := f.domain(t)
	if errors.Is(err, hypervisors.ErrNotFound) {
		f.c.Unlock()
		return nil
	}
	if err != nil {
		f.c.Unlock()
		return fmt.Errorf("stop: %w", err)
	}
	paused := d.Power == observed.PowerPaused
	f.c.Unlock()
	if paused {
		if err := simcore.Sleep(ctx, grace); err != nil {
			return fmt.Errorf("stop %s: waiting for shutdown: %w", simcore.TargetName(t), err)
		}
	}
	f.c.Lock()
	defer f.c.Unlock()
	if _, d, err = f.domain(t); err != nil {
		return nil
	}
	if d.Power != observed.PowerStopped {
		d.PowerOff(observed.PowerStopped)
		f.saveDomain(t.Zone, t.Name)
	}
	return nil
}

// SetAutostart sets the domain's autostart flag.
func (f *Libvirt) SetAutostart(ctx context.Context, t hypervisors.Target, on bool) error {
	return f.changeDomain(ctx, "SetAutostart", "set autostart", t, func(_ *lvHost, d *domain) error {
		if d.Autostart != on {
			d.Autostart = on
			f.saveDomain(t.Zone, t.Name)
		}
		return nil
	})
}

// SetMarker rewrites the domain's marker. It refuses (ErrNotOwned) a
// domain whose marker is missing or names another installation or
// machine.
func (f *Libvirt) SetMarker(ctx context.Context, t hypervisors.Target, m observed.Marker) error {
	return f.changeDomain(ctx, "SetMarker", "set marker", t, func(_ *lvHost, d *domain) error {
		if !simcore.SameOwner(d.Marker, &m) {
			return fmt.Errorf("set marker on %s: %w", simcore.TargetName(t), hypervisors.ErrNotOwned)
		}
		d.Marker = &m
		f.saveDomain(t.Zone, t.Name)
		return nil
	})
}

// Volume is a simulated volume as Volumes reports it.
type Volume struct {
	Pool          string
	Name          string
	Format        string
	CapacityGiB   int
	Backing       string
	BackingFormat string
	// Seed content, for NoCloud ISOs.
	InstanceID string
	Hostname   string
	UserData   string
}

// Volumes returns every volume on a host (all pools, the base image
// included), sorted by pool and name.
func (f *Libvirt) Volumes(zone string) []Volume {
	f.c.Lock()
	defer f.c.Unlock()
	h := f.hosts[zone]
	if h == nil {
		return nil
	}
	var out []Volume
	for pool, vols := range h.Pools {
		for _, v := range vols {
			vv := Volume{Pool: pool, Name: v.Name, Format: v.Format, CapacityGiB: v.CapacityGiB, Backing: v.Backing, BackingFormat: v.BackingFormat}
			if v.Seed != nil {
				vv.InstanceID, vv.Hostname, vv.UserData = v.Seed.InstanceID, v.Seed.Hostname, v.Seed.UserData
			}
			out = append(out, vv)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Pool != out[j].Pool {
			return out[i].Pool < out[j].Pool
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// Out-of-band changes: what an operator or the host does behind the
// provider's back. They are not hypervisor calls (no latency, hook, count
// or reachability check).

// oob applies change to a domain under the lock.
func (f *Libvirt) oob(t hypervisors.Target, change func(h *lvHost, d *domain)) error {
	f.c.Lock()
	defer f.c.Unlock()
	h, d, err := f.domain(t)
	if err != nil {
		return err
	}
	name, pool, disks := d.Name, d.Pool, slices.Clone(d.Disks)
	change(h, d)
	f.saveDomain(t.Zone, name)
	f.saveVolumes(t.Zone, pool, disks...)
	return nil
}

// StopVM powers a domain off out of band.
func (f *Libvirt) StopVM(t hypervisors.Target) error {
	return f.oob(t, func(_ *lvHost, d *domain) { d.PowerOff(observed.PowerStopped) })
}

// CrashVM makes a domain crash out of band.
func (f *Libvirt) CrashVM(t hypervisors.Target) error {
	return f.oob(t, func(_ *lvHost, d *domain) { d.PowerOff(observed.PowerCrashed) })
}

// PauseVM pauses a running domain out of band.
func (f *Libvirt) PauseVM(t hypervisors.Target) error {
	return f.oob(t, func(_ *lvHost, d *domain) {
		if d.Power == observed.PowerRunning {
			d.Power = observed.PowerPaused
		}
	})
}

// ResizeVM changes a domain's vCPU count and memory out of band.
func (f *Libvirt) ResizeVM(t hypervisors.Target, vcpu, memoryMiB int) error {
	if err := simcore.CheckSize(vcpu, memoryMiB); err != nil {
		return fmt.Errorf("resize %s on %s: %w", t.Name, t.Zone, err)
	}
	return f.oob(t, func(_ *lvHost, d *domain) { d.VCPU, d.MemoryMiB = vcpu, memoryMiB })
}

// RemoveVM destroys and undefines a domain and deletes its volumes out of
// band, without any check.
func (f *Libvirt) RemoveVM(t hypervisors.Target) error {
	return f.oob(t, func(h *lvHost, d *domain) {
		for _, v := range d.Disks {
			delete(h.Pools[d.Pool], v)
		}
		delete(h.Domains, d.Name)
	})
}

// RemoveVolume deletes any volume out of band (the base image included).
func (f *Libvirt) RemoveVolume(zone, pool, name string) error {
	f.c.Lock()
	defer f.c.Unlock()
	p, err := f.pool(zone, pool)
	if err != nil {
		return err
	}
	if p[name] == nil {
		return fmt.Errorf("volume %s/%s on %s: %w", pool, name, zone, hypervisors.ErrNotFound)
	}
	delete(p, name)
	f.saveVolumes(zone, pool, name)
	return nil
}

// AddOwnedVM places a complete domain as the provider would have built it
// (overlay and seed volumes named after it, marker m, 2 vCPU, 2048 MiB,
// power as given; running means running since now).
func (f *Libvirt) AddOwnedVM(zone, name string, m observed.Marker, power observed.Power) error {
	return f.addVM(zone, name, &m, power, true)
}

// AddForeignVM places a running domain that is not ours: no marker (m ==
// nil) or another installation's or machine's marker. Its disk is the
// volume "foreign-<name>.qcow2", which lacks our prefix.
func (f *Libvirt) AddForeignVM(zone, name string, m *observed.Marker) error {
	return f.addVM(zone, name, simcore.CloneMarker(m), observed.PowerRunning, false)
}

func (f *Libvirt) addVM(zone, name string, m *observed.Marker, power observed.Power, owned bool) error {
	if err := errors.Join(simcore.CheckVMName(name), simcore.CheckMarker(m)); err != nil {
		return fmt.Errorf("add a VM on %s: %w", zone, err)
	}
	f.c.Lock()
	defer f.c.Unlock()
	h, err := f.host(zone)
	if err != nil {
		return err
	}
	if h.Domains[name] != nil {
		return fmt.Errorf("add %s on %s: %w", name, zone, hypervisors.ErrExists)
	}
	pool := h.Pools[f.opts.Pool]
	base := pool[f.opts.Image]
	overlay := "foreign-" + name + ".qcow2"
	disks := []string{overlay}
	if owned {
		overlay = lvspec.OverlayVolume(name)
		disks = []string{overlay, lvspec.SeedVolume(name)}
		pool[disks[1]] = &volume{Name: disks[1], Format: "iso", CapacityGiB: 1, Seed: &seed{InstanceID: name, Hostname: name}}
	}
	ov := &volume{Name: overlay, Format: "qcow2", CapacityGiB: f.opts.ImageSizeGiB}
	if base != nil {
		ov.Backing, ov.BackingFormat = base.Name, base.Format
	}
	pool[overlay] = ov
	d := &domain{
		Name: name, DomainType: "kvm", VCPU: 2, MemoryMiB: 2048,
		Pool: f.opts.Pool, Disks: disks, Network: f.opts.Network, Marker: m,
		Machine: simcore.Machine{Power: observed.PowerStopped},
	}
	switch power {
	case observed.PowerRunning:
		d.PowerOn(f.c.Now())
	case observed.PowerPaused:
		d.PowerOn(f.c.Now())
		d.Power = observed.PowerPaused
	case "":
	default:
		d.Power = power
	}
	h.Domains[name] = d
	f.saveDomain(zone, name)
	f.saveVolumes(zone, f.opts.Pool, disks...)
	return nil
}

func (f *Libvirt) saveMachine(t hypervisors.Target) { f.saveDomain(t.Zone, t.Name) }
