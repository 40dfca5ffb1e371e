package hypervisors

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/bigfleet-vm/provider/observed"
)

// The step vocabulary: the parameters of the shape-specific steps, as the
// planner puts them in a step and the adapters apply them. The JSON plan
// copies them into its own types (planner/json.go), so a field added here
// does not change the plan format by accident.

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

// SeedSpec is a cloud-init NoCloud ISO (volume label "cidata").
type SeedSpec struct {
	Pool       string `json:"pool" yaml:"pool"`
	Name       string `json:"name" yaml:"name"`
	InstanceID string `json:"instance_id" yaml:"instance_id"`
	Hostname   string `json:"hostname" yaml:"hostname"`
	// UserData is the generic pre-binding cloud-init (never the blob).
	UserData string `json:"user_data,omitempty" yaml:"user_data,omitempty"`
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

// CloneSpec is a Proxmox full clone of a template onto a node.
type CloneSpec struct {
	Name         string          `json:"name" yaml:"name"`
	TemplateVMID int             `json:"template_vmid" yaml:"template_vmid"`
	Pool         string          `json:"pool,omitempty" yaml:"pool,omitempty"`
	Marker       observed.Marker `json:"marker" yaml:"marker"`
	// Labels: as DomainSpec.Labels.
	Labels map[string]string `json:"labels,omitempty" yaml:"labels,omitempty"`
}

// SizeSpec is the Proxmox VM configuration applied after a clone (and
// re-applied to a clone adopted after a crash).
type SizeSpec struct {
	VCPU      int             `json:"vcpu" yaml:"vcpu"`
	MemoryMiB int             `json:"memory_mib" yaml:"memory_mib"`
	OnBoot    bool            `json:"onboot" yaml:"onboot"`
	Marker    observed.Marker `json:"marker" yaml:"marker"`
}
