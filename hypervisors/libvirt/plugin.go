package libvirt

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"path"
	"strings"
	"time"

	"github.com/bigfleet-vm/provider/conffile"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/libvirtsim"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvuri"
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
	"github.com/bigfleet-vm/provider/inventory"
	"github.com/bigfleet-vm/provider/planner"
	"github.com/bigfleet-vm/provider/plugin"
)

// Plugin is the libvirt hypervisor as the composition root registers it:
// its flags, their resolution, its catalog and capacity rules, its
// planner, the go-libvirt adapter and the libvirt-shaped simulator.
func Plugin() plugin.Plugin { return lvPlugin{} }

type lvPlugin struct{}

func (lvPlugin) Info() plugin.Info {
	return plugin.Info{Name: "libvirt", Title: "libvirt", FlagGroup: "libvirt connection and launch parameters",
		DefaultZone: "local", CreateTimeout: 5 * time.Minute,
		Backend: plugin.Backend{Flag: "libvirt-backend", Real: "libvirt", ConnFlag: "connect", RealNoun: "libvirt host", RealNouns: "hosts"}}
}

// flagValues are the libvirt flags registered on a FlagSet.
type flagValues struct {
	backend, connect, capacityType, image *string
	storagePool, network, baseUserData    *string
	domainType, kernel, initrd, cmdline   *string
	callTimeout                           *time.Duration
}

func (lvPlugin) RegisterFlags(fs *flag.FlagSet) plugin.Flags {
	f := &flagValues{}
	f.backend = fs.String("libvirt-backend", "auto", "libvirt, fake or auto (libvirt when --connect is set; otherwise refuse unless --use-fake-backend).")
	f.connect = fs.String("connect", "", "A bare libvirt URI for --default-zone, or a comma-separated zone=uri list (one zone per host).")
	f.image = fs.String("image", "", "Golden base-image volume the overlay disk backs onto (qcow2 or raw). Required for the libvirt backend.")
	f.storagePool = fs.String("storage-pool", "default", "libvirt storage pool for the overlay and cloud-init volumes: one name, or zone=pool,... per host.")
	f.network = fs.String("network", "default", "libvirt network the domain NIC attaches to.")
	f.baseUserData = fs.String("base-user-data", "", "File with the generic pre-binding cloud-init baked into the NoCloud seed at define.")
	f.capacityType = fs.String("capacity-type", "on_demand", "Capacity type of the default offerings: on_demand or bare_metal.")
	f.domainType = fs.String("domain-type", "kvm", "libvirt domain type: kvm, or qemu (emulation, for hosts without KVM).")
	f.kernel = fs.String("kernel", "", "Optional direct kernel boot: absolute kernel path on the libvirt host.")
	f.initrd = fs.String("initrd", "", "Initrd path on the libvirt host (needs --kernel).")
	f.cmdline = fs.String("kernel-cmdline", "", "Kernel command line (needs --kernel).")
	f.callTimeout = fs.Duration("libvirt-call-timeout", DefaultCallTimeout, "Deadline of one libvirt RPC (1s to 1m; keep it well below the 30s observe budget). A call that outlives it fails retryably and has its connection probed; a connection that stops answering is closed and redialled within seconds.")
	return f
}

// Names lists the flags in the order a selection message names them.
func (*flagValues) Names() []string {
	return []string{"libvirt-backend", "connect", "capacity-type", "image", "storage-pool", "network",
		"base-user-data", "domain-type", "kernel", "initrd", "kernel-cmdline", "libvirt-call-timeout"}
}

// Usage lists the flags in the operator docs' order.
func (*flagValues) Usage() []string {
	return []string{"libvirt-backend", "connect", "image", "storage-pool", "network", "base-user-data",
		"capacity-type", "domain-type", "kernel", "initrd", "kernel-cmdline", "libvirt-call-timeout"}
}

func (*flagValues) Bounds() plugin.Bounds {
	return plugin.Bounds{Durations: map[string]plugin.DurationBound{
		"libvirt-call-timeout": {Min: time.Second, Max: time.Minute, Why: "one libvirt RPC; keep it well below the 30s observe budget"},
	}}
}

func (f *flagValues) Backend() (string, bool) {
	return *f.backend, strings.TrimSpace(*f.connect) != ""
}

// ReportsDefaultZone: a bare --connect URI reports an unusable
// --default-zone as its own zone problem.
func (f *flagValues) ReportsDefaultZone(set map[string]bool) bool {
	return set["connect"] && lvuri.IsBare(*f.connect)
}

// Settings are the resolved libvirt flags.
type Settings struct {
	Connect     []lvuri.ZoneURI
	Image       string
	StoragePool string
	// ZonePools overrides StoragePool per zone (--storage-pool zone=pool,...).
	ZonePools    map[string]string
	Network      string
	BaseUserData []byte
	DomainType   string // "kvm" or "qemu"
	Kernel       string
	Initrd       string
	Cmdline      string
	// CallTimeout bounds one libvirt RPC (--libvirt-call-timeout).
	CallTimeout time.Duration
	// CapacityType is --capacity-type, the default offerings' capacity.
	CapacityType inventory.CapacityType

	real  bool
	zones []string
}

// Resolve fills Settings. The --connect zones are kept when the real
// backend is selected and --connect parsed cleanly.
func (f *flagValues) Resolve(env plugin.Env, p plugin.Problems) plugin.Resolved {
	l := &Settings{real: env.Real}
	real := env.Real
	conns, connErr := lvuri.ParseConnect(*f.connect, env.DefaultZone)
	if connErr != nil {
		p.AddErr("connect", connErr)
	}
	l.Connect = conns
	if real && strings.TrimSpace(*f.connect) == "" {
		p.Add("connect", "is required by the libvirt backend: pass one URI such as qemu:///system, or zone=uri pairs such as rack1=qemu+libssh://bigfleet@host-a/system?keyfile=...&known_hosts=...")
	}
	l.Image = strings.TrimSpace(*f.image)
	if real && l.Image == "" {
		p.Add("image", "is required by the libvirt backend: name the golden base-image volume in --storage-pool, e.g. ubuntu-24.04.qcow2")
	}
	l.StoragePool, l.ZonePools = parseStoragePool(*f.storagePool, conns, p)
	l.Network = strings.TrimSpace(*f.network)
	if l.Network == "" {
		p.Add("network", "is empty; name the libvirt network the NIC attaches to (default: default)")
	}
	switch dt := strings.ToLower(strings.TrimSpace(*f.domainType)); dt {
	case "kvm", "qemu":
		l.DomainType = dt
	default:
		p.Add("domain-type", "unknown domain type %q; use kvm (hardware virtualisation) or qemu (emulation)", *f.domainType)
	}
	l.Kernel, l.Initrd, l.Cmdline = *f.kernel, *f.initrd, *f.cmdline
	l.CallTimeout = *f.callTimeout
	p.Duration("libvirt-call-timeout", l.CallTimeout)
	for _, k := range []struct{ name, v string }{{"kernel", l.Kernel}, {"initrd", l.Initrd}} {
		if k.v != "" && !path.IsAbs(k.v) {
			p.Add(k.name, "%q must be an absolute path on the libvirt host", k.v)
		}
	}
	if l.Kernel == "" {
		for _, k := range []struct{ name, v string }{{"initrd", l.Initrd}, {"kernel-cmdline", l.Cmdline}} {
			if k.v != "" {
				p.Add(k.name, "only applies to direct kernel boot; also pass --kernel, or drop it")
			}
		}
	}
	if *f.baseUserData != "" {
		data, err := conffile.Read(*f.baseUserData, conffile.MaxUserDataBytes)
		if err != nil {
			p.Add("base-user-data", "cannot read the cloud-init file: %v", err)
		}
		l.BaseUserData = data
	}
	capacity, err := inventory.ParseCapacityType(*f.capacityType, l.CapacityRules())
	if err != nil {
		p.AddErr("capacity-type", err)
		capacity = inventory.OnDemand
	}
	l.CapacityType = capacity
	if !real || connErr != nil || len(conns) == 0 {
		return l
	}
	l.zones = make([]string, len(conns))
	for i, zu := range conns {
		l.zones[i] = zu.Zone
	}
	return l
}

// parseStoragePool reads --storage-pool: one pool for every host, or
// zone=pool pairs (hosts not named use "default").
func parseStoragePool(v string, conns []lvuri.ZoneURI, p plugin.Problems) (string, map[string]string) {
	v = strings.TrimSpace(v)
	if v == "" {
		p.Add("storage-pool", "is empty; name the libvirt storage pool for overlay and seed volumes (default: default)")
		return "", nil
	}
	if !strings.Contains(v, "=") {
		return v, nil
	}
	zones := map[string]bool{}
	for _, c := range conns {
		zones[c.Zone] = true
	}
	pools := map[string]string{}
	for _, entry := range strings.Split(v, ",") {
		zone, pool, ok := strings.Cut(strings.TrimSpace(entry), "=")
		zone, pool = strings.TrimSpace(zone), strings.TrimSpace(pool)
		switch {
		case !ok || zone == "" || pool == "":
			p.Add("storage-pool", "entry %q is not zone=pool", entry)
		case pools[zone] != "":
			p.Add("storage-pool", "zone %q is named twice", zone)
		case len(conns) > 0 && !zones[zone]:
			p.Add("storage-pool", "zone %q is not a --connect zone", zone)
		default:
			pools[zone] = pool
		}
	}
	return "default", pools
}

func (l *Settings) Zones() ([]string, string) { return l.zones, "connect" }

func (l *Settings) Capacity() inventory.CapacityType { return l.CapacityType }

// Catalog: kvm.* built-in types; VMs boot from --image, so an entry
// cannot name a template.
func (l *Settings) Catalog() inventory.CatalogRules {
	return inventory.CatalogRules{Prefix: "kvm.", Keys: "vcpu, memory_mib", Source: func(v *int) (int, error) {
		if v != nil {
			return 0, errors.New("template_vmid is a Proxmox setting; libvirt types boot from --image, remove the key")
		}
		return 0, nil
	}}
}

// CapacityRules: a libvirt host can be a fixed free pool (bare_metal).
func (l *Settings) CapacityRules() inventory.CapacityRules {
	return inventory.CapacityRules{Where: "a libvirt host", BareMetal: true}
}

func (l *Settings) Summary() (string, []slog.Attr) {
	return fmt.Sprintf(" image=%s storage_pool=%s network=%s", l.Image, l.StoragePool, l.Network),
		[]slog.Attr{slog.String("image", l.Image), slog.String("storage_pool", l.StoragePool), slog.String("network", l.Network)}
}

// Planner: an empty --image on the simulator plans its golden image.
func (l *Settings) Planner(o plugin.PlannerOptions) planner.Plugin {
	s := PlanSettings{Pool: l.StoragePool, ZonePools: l.ZonePools, Image: l.Image, Network: l.Network, DomainType: l.DomainType,
		UserData: string(l.BaseUserData), Kernel: l.Kernel, Initrd: l.Initrd, Cmdline: l.Cmdline}
	if s.Image == "" && o.Simulated {
		s.Image = libvirtsim.DefaultImage
	}
	return Planner(s)
}

// Open connects one go-libvirt client per --connect zone. It never
// blocks on a host: connections are made and re-made in the background,
// and an unreachable host is observed as unknown.
func (l *Settings) Open(_ context.Context, o plugin.OpenOptions) (hypervisors.Hypervisor, error) {
	lc := Config{Installation: o.Installation, Pool: l.StoragePool, CallTimeout: l.CallTimeout}
	for _, z := range l.Connect {
		lc.Zones = append(lc.Zones, ZoneURI{Zone: z.Zone, URI: z.URI, Pool: l.ZonePools[z.Zone]})
	}
	return New(lc, o.Logger.With("hypervisor", "libvirt"))
}

// OpenSimulator opens the libvirt-shaped simulator with the pool,
// network and image the flags name.
func (l *Settings) OpenSimulator(o plugin.SimOptions) (hypervisors.Hypervisor, error) {
	opts := libvirtsim.Options{
		Options: simcore.Options{Zones: o.Zones, Latency: o.Latency, Faults: o.Faults, SlowOK: o.SlowOK, Host: o.Host,
			State: o.State, ReadOnly: o.ReadOnly},
		Pool: l.StoragePool, Network: l.Network, Image: l.Image,
	}
	if o.Journal != nil {
		opts.Store = o.Journal
	}
	return libvirtsim.OpenLibvirt(opts)
}

// String summarises the settings (never the base user data).
func (l *Settings) String() string {
	text, _ := l.Summary()
	return "libvirt{" + strings.TrimSpace(text) + "}"
}

// GoString is String, for %#v.
func (l *Settings) GoString() string { return l.String() }

// LogValue is the Summary's attributes.
func (l *Settings) LogValue() slog.Value {
	_, attrs := l.Summary()
	return slog.GroupValue(attrs...)
}
