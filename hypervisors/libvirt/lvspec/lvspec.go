package lvspec

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/jsonplan"
	"github.com/bigfleet-vm/provider/naming"
	"github.com/bigfleet-vm/provider/observed"
)

// OverlayVolume is the name of a domain's copy-on-write disk volume.
func OverlayVolume(vmName string) string { return vmName + "-disk.qcow2" }

// SeedVolume is the name of a domain's cloud-init NoCloud ISO volume.
func SeedVolume(vmName string) string { return vmName + "-cidata.iso" }

// VolumePrefix is the prefix of every volume this project creates (its
// domain's name's, naming.Prefix); the adapter never deletes a volume
// without it.
const VolumePrefix = naming.Prefix

// The libvirt actions, as plans and metrics name them.
const (
	ActionCreateOverlay = "create-overlay"
	ActionCreateSeed    = "create-seed"
	ActionDefine        = "define"
	ActionAutostart     = "autostart"
	ActionUndefine      = "undefine"
	ActionDeleteVolume  = "delete-volume"
)

// Actions describes the libvirt vocabulary. Every step loads the host;
// undefine and delete-volume destroy, and undefine re-checks the live
// marker first (volumes carry no marker to check).
var Actions = []hypervisors.ActionInfo{
	{Name: ActionCreateOverlay, Effect: hypervisors.EffectCreate, Heavy: true, Op: "create_overlay"},
	{Name: ActionCreateSeed, Effect: hypervisors.EffectCreate, Heavy: true, Op: "create_seed"},
	{Name: ActionDefine, Effect: hypervisors.EffectCreate, Heavy: true, Op: "define_domain"},
	{Name: ActionAutostart, Effect: hypervisors.EffectChange, Heavy: true, Op: "set_autostart"},
	{Name: ActionUndefine, Effect: hypervisors.EffectDestroy, OwnerCheck: true, Heavy: true, Op: "undefine_domain"},
	{Name: ActionDeleteVolume, Effect: hypervisors.EffectDestroy, Heavy: true, Op: "delete_volume"},
}

func info(name string) hypervisors.ActionInfo {
	for _, a := range Actions {
		if a.Name == name {
			return a
		}
	}
	panic("lvspec: unknown action " + name)
}

var (
	infoOverlay  = info(ActionCreateOverlay)
	infoSeed     = info(ActionCreateSeed)
	infoDefine   = info(ActionDefine)
	infoAuto     = info(ActionAutostart)
	infoUndefine = info(ActionUndefine)
	infoDelete   = info(ActionDeleteVolume)
)

// Steps are what a libvirt-shaped adapter does for the libvirt steps.
type Steps interface {
	CreateOverlay(ctx context.Context, zone string, spec OverlaySpec) error
	CreateSeed(ctx context.Context, zone string, spec SeedSpec) error
	DefineDomain(ctx context.Context, zone string, spec DomainSpec) error
	SetAutostart(ctx context.Context, t hypervisors.Target, on bool) error
	UndefineDomain(ctx context.Context, t hypervisors.Target) error
	DeleteVolume(ctx context.Context, zone, pool, name string) error
}

// Apply performs one libvirt step on s: the Apply of every libvirt-shaped
// adapter. Params of another vocabulary are ErrUnsupported.
func Apply(ctx context.Context, s Steps, t hypervisors.Target, p hypervisors.StepParams) (int, error) {
	switch p := p.(type) {
	case *OverlaySpec:
		return 0, s.CreateOverlay(ctx, t.Zone, *p)
	case *SeedSpec:
		return 0, s.CreateSeed(ctx, t.Zone, *p)
	case *DomainSpec:
		return 0, s.DefineDomain(ctx, t.Zone, *p)
	case *Autostart:
		return 0, s.SetAutostart(ctx, t, p.On)
	case *Undefine:
		return 0, s.UndefineDomain(ctx, t)
	case *DeleteVolume:
		return 0, s.DeleteVolume(ctx, t.Zone, p.Pool, p.Volume)
	}
	return 0, fmt.Errorf("%s on libvirt: %w", p.Info().Name, hypervisors.ErrUnsupported)
}

// OverlaySpec is a copy-on-write qcow2 volume backed by the golden image.
type OverlaySpec struct {
	Pool string `json:"pool" yaml:"pool"`
	Name string `json:"name" yaml:"name"`
	// BaseImage is the golden image volume name in Pool; its real format is
	// read from the volume and declared as the backing format.
	BaseImage string `json:"base_image" yaml:"base_image"`
	// MinCapacityGiB is the overlay's minimum virtual size (0: the base's).
	MinCapacityGiB int `json:"min_capacity_gib,omitempty" yaml:"min_capacity_gib,omitempty"`
}

func (*OverlaySpec) Info() hypervisors.ActionInfo { return infoOverlay }

func (o *OverlaySpec) PlanJSON(out *jsonplan.Params) {
	out.Overlay = &jsonplan.Overlay{Pool: o.Pool, Name: o.Name, BaseImage: o.BaseImage, MinCapacityGiB: o.MinCapacityGiB}
}

// SeedSpec is a cloud-init NoCloud ISO (volume label "cidata").
type SeedSpec struct {
	Pool       string `json:"pool" yaml:"pool"`
	Name       string `json:"name" yaml:"name"`
	InstanceID string `json:"instance_id" yaml:"instance_id"`
	Hostname   string `json:"hostname" yaml:"hostname"`
	// UserData is the generic pre-binding cloud-init (never the blob).
	UserData string `json:"user_data,omitempty" yaml:"user_data,omitempty"`
}

func (*SeedSpec) Info() hypervisors.ActionInfo { return infoSeed }

func (s *SeedSpec) PlanJSON(out *jsonplan.Params) {
	out.Seed = &jsonplan.Seed{Pool: s.Pool, Name: s.Name, InstanceID: s.InstanceID, Hostname: s.Hostname, UserData: s.UserData}
}

// SeedIdentity is the content identity of the NoCloud seed built from s:
// a digest of exactly the inputs that shape the ISO (instance id, hostname
// and user-data; never pool or volume name). Adapters record it with the
// volume they upload and report it in observed.Volume.Identity; the
// planner rebuilds a seed whose identity differs from the one it wants.
func SeedIdentity(s SeedSpec) string {
	h := sha256.New()
	for _, f := range []string{s.InstanceID, s.Hostname, s.UserData} {
		h.Write([]byte(f))
		h.Write([]byte{0})
	}
	return "seed1-" + hex.EncodeToString(h.Sum(nil))[:32]
}

// DomainSpec is a libvirt domain definition.
type DomainSpec struct {
	Name       string `json:"name" yaml:"name"`
	VCPU       int    `json:"vcpu" yaml:"vcpu"`
	MemoryMiB  int    `json:"memory_mib" yaml:"memory_mib"`
	DomainType string `json:"domain_type" yaml:"domain_type"` // kvm | qemu
	Pool       string `json:"pool" yaml:"pool"`
	Overlay    string `json:"overlay" yaml:"overlay"`
	Seed       string `json:"seed" yaml:"seed"`
	Network    string `json:"network" yaml:"network"`
	// Optional direct kernel boot; the overlay disk stays attached.
	Kernel  string          `json:"kernel,omitempty" yaml:"kernel,omitempty"`
	Initrd  string          `json:"initrd,omitempty" yaml:"initrd,omitempty"`
	Cmdline string          `json:"cmdline,omitempty" yaml:"cmdline,omitempty"`
	Marker  observed.Marker `json:"marker" yaml:"marker"`
	// Labels are the slot's offering labels (the simulator reads its
	// conformance fault labels from them; real adapters ignore them).
	Labels map[string]string `json:"labels,omitempty" yaml:"labels,omitempty"`
}

func (*DomainSpec) Info() hypervisors.ActionInfo { return infoDefine }

func (d *DomainSpec) PlanJSON(out *jsonplan.Params) {
	out.Domain = &jsonplan.Domain{Name: d.Name, VCPU: d.VCPU, MemoryMiB: d.MemoryMiB, DomainType: d.DomainType, Pool: d.Pool,
		Overlay: d.Overlay, Seed: d.Seed, Network: d.Network, Kernel: d.Kernel, Initrd: d.Initrd, Cmdline: d.Cmdline,
		Marker: hypervisors.JSONMarker(d.Marker), Labels: maps.Clone(d.Labels)}
}

// Autostart sets whether the domain starts with its host.
type Autostart struct{ On bool }

func (*Autostart) Info() hypervisors.ActionInfo { return infoAuto }

func (a *Autostart) PlanJSON(out *jsonplan.Params) { out.Autostart = a.On }

// Undefine removes the domain's definition (the VM, not its volumes).
type Undefine struct{}

func (*Undefine) Info() hypervisors.ActionInfo { return infoUndefine }

func (*Undefine) PlanJSON(*jsonplan.Params) {}

// DeleteVolume deletes one volume.
type DeleteVolume struct{ Pool, Volume string }

func (*DeleteVolume) Info() hypervisors.ActionInfo { return infoDelete }

func (d *DeleteVolume) PlanJSON(out *jsonplan.Params) { out.Pool, out.Volume = d.Pool, d.Volume }
