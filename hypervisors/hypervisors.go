package hypervisors

import (
	"context"
	"os"
	"time"

	"github.com/bigfleet-vm/provider/observed"
)

// Shape names the family of steps a hypervisor understands. The planner
// emits libvirt-shaped steps (volumes, define) or Proxmox-shaped steps
// (clone, configure-vm) according to it; power and guest-agent steps are
// common to both.
type Shape string

const (
	ShapeLibvirt Shape = "libvirt"
	ShapeProxmox Shape = "proxmox"
)

// Target names one VM: a libvirt domain by name, a Proxmox VM by VMID (and
// name, for messages).
type Target struct {
	Zone string `json:"zone" yaml:"zone"`
	Name string `json:"name,omitempty" yaml:"name,omitempty"`
	VMID int    `json:"vmid,omitempty" yaml:"vmid,omitempty"`
}

// Hypervisor is the narrow interface the executor and observers drive: the
// operations common to both shapes. One value serves every zone of one
// hypervisor installation. An adapter also implements the steps of its
// shape (LibvirtSteps or ProxmoxSteps), which consumers reach with Find.
//
// Every method takes a context and must return when it is done; adapters
// whose client takes no context wrap the call and treat a timed-out call
// as a broken connection.
//
// Every mutating method (here and in the shape interfaces) is an ensure:
// calling it again after a crash at any point converges on the same VMs
// and volumes instead of duplicating them, and it adopts an existing
// object only if it carries our marker.
type Hypervisor interface {
	Shape() Shape
	// Zones lists the configured zones (libvirt hosts, Proxmox nodes).
	Zones() []string
	// Observe lists one zone. An error means the zone is unknown.
	Observe(ctx context.Context, zone string) (*observed.Zone, error)
	// Lookup re-reads one VM (ErrNotFound if it does not exist).
	Lookup(ctx context.Context, t Target) (*observed.VM, error)

	// Power. Start and Resume are no-ops on a running VM. Stop shuts the
	// guest down gracefully for at most grace, then powers it off; a
	// stopped or missing VM is success.
	Start(ctx context.Context, t Target) error
	Resume(ctx context.Context, t Target) error
	Stop(ctx context.Context, t Target, grace time.Duration) error
	SetAutostart(ctx context.Context, t Target, on bool) error
	// SetMarker rewrites the ownership/binding marker on the VM.
	SetMarker(ctx context.Context, t Target, m observed.Marker) error

	// Guest agent. AgentPing returns ErrAgentNotReady while the agent is
	// not connected. AgentWriteFile and AgentRemoveFile are idempotent
	// (safe to repeat after any error).
	//
	// AgentExec runs argv at most once: it sends the start request once,
	// then polls the pid (retrying failed polls) until the process exits
	// or ctx is done. Its error says whether argv may have run:
	//   - nil: it ran to exit (a non-zero exit is in the result);
	//   - a Retryable class: it certainly did not start (e.g. the agent
	//     was not connected), so it may be sent again;
	//   - ErrOutcomeUnknown (an *UnknownOutcomeError): it may have
	//     started, and its outcome cannot be learned; never send it again;
	//   - any other class: it certainly did not start, and sending it
	//     again cannot succeed.
	AgentPing(ctx context.Context, t Target) error
	AgentWriteFile(ctx context.Context, t Target, path string, data []byte, mode os.FileMode) error
	AgentRemoveFile(ctx context.Context, t Target, path string) error
	AgentExec(ctx context.Context, t Target, argv []string) (ExecResult, error)

	Close() error
}

// LibvirtSteps are the steps of ShapeLibvirt: a VM is an overlay volume
// on the golden image, a cloud-init seed volume and a domain defined on
// them. Every libvirt-shaped adapter implements it.
type LibvirtSteps interface {
	CreateOverlay(ctx context.Context, zone string, spec OverlaySpec) error
	CreateSeed(ctx context.Context, zone string, spec SeedSpec) error
	DefineDomain(ctx context.Context, zone string, spec DomainSpec) error
	UndefineDomain(ctx context.Context, t Target) error
	DeleteVolume(ctx context.Context, zone, pool, name string) error
}

// ProxmoxSteps are the steps of ShapeProxmox: a VM is a full clone of a
// template, sized after cloning. Every Proxmox-shaped adapter implements
// it.
type ProxmoxSteps interface {
	// CloneVM returns the VMID of the (new or adopted) clone.
	CloneVM(ctx context.Context, zone string, spec CloneSpec) (int, error)
	ConfigureVM(ctx context.Context, t Target, spec SizeSpec) error
	DeleteVM(ctx context.Context, t Target) error
}
