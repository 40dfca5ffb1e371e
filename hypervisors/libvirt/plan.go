package libvirt

import (
	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/planner"
)

// The in-guest paths of the image hook contract.
const (
	BlobPath = "/opt/bigfleet/bootstrap.blob"
	HookPath = "/opt/bigfleet/bootstrap"
)

// PlanSettings are the libvirt settings plans are built from.
type PlanSettings struct {
	Pool string
	// ZonePools overrides Pool per zone.
	ZonePools                            map[string]string
	Image, Network, DomainType, UserData string
	Kernel, Initrd, Cmdline              string
}

// Planner is the libvirt plug-in's planning half: a VM is an overlay
// volume on the golden image and a cloud-init seed volume, with a domain
// defined on them and started with its host.
func Planner(s PlanSettings) planner.Plugin { return &plan{s} }

type plan struct{ s PlanSettings }

func (*plan) Name() string { return "libvirt" }

func (*plan) Actions() []hypervisors.ActionInfo { return lvspec.Actions }

// DriftSeedMismatch: a seed volume does not carry the content identity of
// the seed the machine needs (repaired by rebuilding it).
const DriftSeedMismatch planner.DriftKind = "seed-mismatch"

func (*plan) DriftKinds() []planner.DriftKind { return []planner.DriftKind{DriftSeedMismatch} }

func (*plan) Observation() planner.Observation {
	return planner.Observation{Identity: planner.ByName, Volumes: true}
}

func (p *plan) pool(zone string) string {
	if pool := p.s.ZonePools[zone]; pool != "" {
		return pool
	}
	return p.s.Pool
}

func (p *plan) Create(b *planner.Builder, vm *observed.VM) {
	m := b.Machine()
	if vm != nil {
		b.EnsureRunning(vm, "intent:create")
		if !vm.Autostart {
			b.AddOn(vm, "", &lvspec.Autostart{On: true}, "intent:create")
		}
		return
	}
	ix := b.Index()
	if len(ix.ByName(m.Zone, m.VMName)) > 0 {
		b.Drift(planner.DriftNameCollision, planner.PolicyFail, m.VMName, "domain name "+m.VMName+" is taken by a domain this installation does not own")
		b.Fail("cannot create: domain name " + m.VMName + " on " + m.Zone + " is taken by a domain this provider does not own")
		return
	}
	pool := p.pool(m.Zone)
	overlay, seed := lvspec.OverlayVolume(m.VMName), lvspec.SeedVolume(m.VMName)
	t := hypervisors.Target{Zone: m.Zone, Name: m.VMName}
	// The overlay and the seed are independent of each other: both may
	// be built at once, and the domain waits for both.
	var deps []string
	if ix.Volume(m.Zone, overlay) == nil {
		deps = append(deps, b.AddAfter(t, "disk", &lvspec.OverlaySpec{Pool: pool, Name: overlay, BaseImage: p.s.Image}, "missing", nil))
	}
	// A seed is trusted by its content identity, not its name: a volume
	// left by a crash between create and upload, or built from other
	// inputs, is rebuilt before the domain that boots from it is defined.
	want := lvspec.SeedSpec{Pool: pool, Name: seed, InstanceID: m.ID, Hostname: m.VMName, UserData: p.s.UserData}
	switch sv := ix.Volume(m.Zone, seed); {
	case sv == nil:
		deps = append(deps, b.AddAfter(t, "cidata", &want, "missing", nil))
	case sv.Identity != lvspec.SeedIdentity(want):
		detail := "seed volume " + seed + " carries no content identity (created but never fully uploaded); rebuilding it"
		if sv.Identity != "" {
			detail = "seed volume " + seed + " was built from other inputs (" + sv.Identity + "); rebuilding it"
		}
		b.Drift(DriftSeedMismatch, planner.PolicyRepair, m.VMName, detail)
		deps = append(deps, b.AddAfter(t, "cidata", &want, "drift:seed-mismatch", nil))
	}
	b.AddAfter(t, "", &lvspec.DomainSpec{Name: m.VMName, VCPU: m.VCPU, MemoryMiB: m.MemoryMiB,
		DomainType: p.s.DomainType, Pool: pool, Overlay: overlay, Seed: seed, Network: p.s.Network,
		Kernel: p.s.Kernel, Initrd: p.s.Initrd, Cmdline: p.s.Cmdline, Marker: b.Marker(""), Labels: m.Labels}, "missing", deps)
	b.Start(t, "intent:create")
	b.Add(t, "", &lvspec.Autostart{On: true}, "intent:create")
}

func (p *plan) Destroy(b *planner.Builder, vm *observed.VM, reason string, leftovers bool) {
	m := b.Machine()
	if vm != nil {
		b.AddOn(vm, "", &lvspec.Undefine{}, reason)
	}
	if m.VMName == "" {
		return
	}
	// Volumes: deleted when observed, and (unless only leftovers are
	// reaped) also when the listing is older than the intent, since a
	// volume created since could be missing from it.
	z := b.Zone()
	authoritative := leftovers || !z.VolumesAt.IsZero() && !z.VolumesAt.Before(b.IntentStarted())
	t := hypervisors.Target{Zone: m.Zone, Name: m.VMName}
	for _, vol := range []struct{ name, tag string }{{lvspec.OverlayVolume(m.VMName), "disk"}, {lvspec.SeedVolume(m.VMName), "cidata"}} {
		if b.Index().Volume(m.Zone, vol.name) != nil || !authoritative {
			b.Add(t, vol.tag, &lvspec.DeleteVolume{Pool: p.pool(m.Zone), Volume: vol.name}, reason)
		}
	}
}

func (*plan) Bootstrap(m *desired.Machine) ([]string, string) {
	return []string{HookPath, m.Cluster}, BlobPath
}

func (p *plan) Volumes(m *desired.Machine) (string, []string) {
	if m.VMName == "" {
		return "", nil
	}
	return p.pool(m.Zone), []string{lvspec.OverlayVolume(m.VMName), lvspec.SeedVolume(m.VMName)}
}
