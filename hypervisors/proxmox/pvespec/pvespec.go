package pvespec

import (
	"context"
	"fmt"
	"maps"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/jsonplan"
	"github.com/bigfleet-vm/provider/observed"
)

// The Proxmox actions, as plans and metrics name them.
const (
	ActionClone       = "clone"
	ActionConfigureVM = "configure-vm"
	ActionDeleteVM    = "delete-vm"
)

// Actions describes the Proxmox vocabulary; every step loads the host.
var Actions = []hypervisors.ActionInfo{
	{Name: ActionClone, Effect: hypervisors.EffectCreate, Heavy: true, Op: "clone_vm"},
	{Name: ActionConfigureVM, Effect: hypervisors.EffectChange, Heavy: true, Op: "configure_vm"},
	{Name: ActionDeleteVM, Effect: hypervisors.EffectDestroy, OwnerCheck: true, Heavy: true, Op: "delete_vm"},
}

var (
	infoClone     = Actions[0]
	infoConfigure = Actions[1]
	infoDelete    = Actions[2]
)

// Steps are what a Proxmox-shaped adapter does for the Proxmox steps.
type Steps interface {
	// CloneVM returns the VMID of the (new or adopted) clone.
	CloneVM(ctx context.Context, zone string, spec CloneSpec) (int, error)
	ConfigureVM(ctx context.Context, t hypervisors.Target, spec SizeSpec) error
	DeleteVM(ctx context.Context, t hypervisors.Target) error
}

// Apply performs one Proxmox step on s: the Apply of every Proxmox-shaped
// adapter. Params of another vocabulary are ErrUnsupported.
func Apply(ctx context.Context, s Steps, t hypervisors.Target, p hypervisors.StepParams) (int, error) {
	switch p := p.(type) {
	case *CloneSpec:
		return s.CloneVM(ctx, t.Zone, *p)
	case *SizeSpec:
		return 0, s.ConfigureVM(ctx, t, *p)
	case *DeleteVM:
		return 0, s.DeleteVM(ctx, t)
	}
	return 0, fmt.Errorf("%s on proxmox: %w", p.Info().Name, hypervisors.ErrUnsupported)
}

// CloneSpec is a Proxmox full clone of a template onto a node.
type CloneSpec struct {
	Name         string          `json:"name" yaml:"name"`
	TemplateVMID int             `json:"template_vmid" yaml:"template_vmid"`
	Pool         string          `json:"pool,omitempty" yaml:"pool,omitempty"`
	Marker       observed.Marker `json:"marker" yaml:"marker"`
	// Labels are the slot's offering labels (the simulator reads its
	// conformance fault labels from them; real adapters ignore them).
	Labels map[string]string `json:"labels,omitempty" yaml:"labels,omitempty"`
}

func (*CloneSpec) Info() hypervisors.ActionInfo { return infoClone }

func (c *CloneSpec) PlanJSON(out *jsonplan.Params) {
	out.Clone = &jsonplan.Clone{Name: c.Name, TemplateVMID: c.TemplateVMID, Pool: c.Pool, Marker: hypervisors.JSONMarker(c.Marker),
		Labels: maps.Clone(c.Labels)}
}

// SizeSpec is the Proxmox VM configuration applied after a clone (and
// re-applied to a clone adopted after a crash).
type SizeSpec struct {
	VCPU      int             `json:"vcpu" yaml:"vcpu"`
	MemoryMiB int             `json:"memory_mib" yaml:"memory_mib"`
	OnBoot    bool            `json:"onboot" yaml:"onboot"`
	Marker    observed.Marker `json:"marker" yaml:"marker"`
}

func (*SizeSpec) Info() hypervisors.ActionInfo { return infoConfigure }

func (s *SizeSpec) PlanJSON(out *jsonplan.Params) {
	out.Size = &jsonplan.Size{VCPU: s.VCPU, MemoryMiB: s.MemoryMiB, OnBoot: s.OnBoot, Marker: hypervisors.JSONMarker(s.Marker)}
}

// DeleteVM destroys the VM and its disks.
type DeleteVM struct{}

func (*DeleteVM) Info() hypervisors.ActionInfo { return infoDelete }

func (*DeleteVM) PlanJSON(*jsonplan.Params) {}

// The range of VMIDs Proxmox accepts.
const (
	MinVMID = 100
	MaxVMID = 999999999
)
