package hypervisors

import (
	"context"
	"os"
	"time"

	"github.com/bigfleet-vm/provider/observed"
)

// Target names one VM in a zone: by Name on a hypervisor whose VMs are
// found by name (planner.ByName: libvirt's domains), by VMID on one that
// allocates a numeric id at create (planner.ByID: Proxmox), with the name
// kept for messages.
type Target struct {
	Zone string `json:"zone" yaml:"zone"`
	Name string `json:"name,omitempty" yaml:"name,omitempty"`
	VMID int    `json:"vmid,omitempty" yaml:"vmid,omitempty"`
}

// Hypervisor is the narrow interface the executor and observers drive: the
// operations every hypervisor has. One value serves every zone of one
// hypervisor installation. Apply performs the steps of the hypervisor's
// own vocabulary (its plug-in's StepParams); optional parts are reached
// with Find or CapabilitiesOf.
//
// Every method takes a context and must return when it is done; adapters
// whose client takes no context wrap the call and treat a timed-out call
// as a broken connection.
//
// Every mutating method (here and in Apply) is an ensure:
// calling it again after a crash at any point converges on the same VMs
// and volumes instead of duplicating them, and it adopts an existing
// object only if it carries our marker.
type Hypervisor interface {
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

	// Apply performs one step of the hypervisor's own vocabulary.
	Applier

	Close() error
}
