package hypervisors

import (
	"context"
	"errors"
	"fmt"
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

// Error classes. Adapters wrap raw errors so that errors.Is(err, ErrX)
// holds; the executor branches only on these.
var (
	// ErrNotFound: the VM, volume or file does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists: the name or VMID is taken by something we do not own.
	ErrExists = errors.New("already exists")
	// ErrLocked: the object is locked by another operation (retryable).
	ErrLocked = errors.New("locked")
	// ErrTransient: a timeout, 5xx or dropped connection (retryable).
	ErrTransient = errors.New("transient failure")
	// ErrUnreachable: the host or API cannot be reached (retryable; the
	// zone is observed as unknown).
	ErrUnreachable = errors.New("unreachable")
	// ErrPermission: authentication or authorisation failed (terminal).
	ErrPermission = errors.New("permission denied")
	// ErrInvalid: the request cannot succeed as made (terminal).
	ErrInvalid = errors.New("invalid request")
	// ErrAgentNotReady: the guest agent is not (yet) connected (retryable
	// while waiting for the agent).
	ErrAgentNotReady = errors.New("guest agent not ready")
	// ErrNotOwned: the object does not carry this installation's marker;
	// nothing destructive may be done to it (terminal).
	ErrNotOwned = errors.New("not owned by this installation")
	// ErrUnsupported: the hypervisor has no such operation (terminal).
	ErrUnsupported = errors.New("unsupported by this hypervisor")
	// ErrOutcomeUnknown: a guest command may have started, and whether or
	// how it ended cannot be learned (the start request went unanswered,
	// the deadline passed while it ran, or the agent forgot its pid).
	// Terminal: sending it again could run it twice.
	ErrOutcomeUnknown = errors.New("outcome unknown")
)

// Retryable reports whether an error is of a transient class. An
// ErrOutcomeUnknown is never retryable, whatever else its chain holds.
func Retryable(err error) bool {
	if errors.Is(err, ErrOutcomeUnknown) {
		return false
	}
	return errors.Is(err, ErrLocked) || errors.Is(err, ErrTransient) ||
		errors.Is(err, ErrUnreachable) || errors.Is(err, ErrAgentNotReady)
}

// UnknownOutcomeError is an ErrOutcomeUnknown that says what is known:
// the command, its pid if the agent reported one, and why the outcome
// cannot be learned. It does not wrap the cause, so no retryable class
// reaches errors.Is through it.
type UnknownOutcomeError struct {
	// Command names what ran (argv[0]; never arguments, which may be
	// long).
	Command string
	// PID is the guest pid the agent reported (0: the start request went
	// unanswered, so the command may or may not have started).
	PID int
	// Why is the cause, e.g. the deadline or the agent's answer.
	Why string
}

func (e *UnknownOutcomeError) Error() string {
	if e.PID > 0 {
		return fmt.Sprintf("%s started as pid %d; its outcome is unknown because %s: %v", e.Command, e.PID, e.Why, ErrOutcomeUnknown)
	}
	return fmt.Sprintf("%s may have started; its outcome is unknown because %s: %v", e.Command, e.Why, ErrOutcomeUnknown)
}

// Unwrap makes errors.Is(err, ErrOutcomeUnknown) hold.
func (e *UnknownOutcomeError) Unwrap() error { return ErrOutcomeUnknown }

// Target names one VM: a libvirt domain by name, a Proxmox VM by VMID (and
// name, for messages).
type Target struct {
	Zone string `json:"zone" yaml:"zone"`
	Name string `json:"name,omitempty" yaml:"name,omitempty"`
	VMID int    `json:"vmid,omitempty" yaml:"vmid,omitempty"`
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

// SeedSpec is a cloud-init NoCloud ISO (volume label "cidata").
type SeedSpec struct {
	Pool       string `json:"pool" yaml:"pool"`
	Name       string `json:"name" yaml:"name"`
	InstanceID string `json:"instance_id" yaml:"instance_id"`
	Hostname   string `json:"hostname" yaml:"hostname"`
	// UserData is the generic pre-binding cloud-init (never the blob).
	UserData string `json:"user_data,omitempty" yaml:"user_data,omitempty"`
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

// Tail keeps the last n bytes of b (nil when empty): how adapters bound
// the output they return in an ExecResult.
func Tail(b []byte, n int) []byte {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	if len(b) == 0 {
		return nil
	}
	return b
}

// ExecResult is the outcome of a guest-agent command that ran to exit.
// Stdout and Stderr are bounded by the adapter (the tail is kept).
type ExecResult struct {
	ExitCode int
	Stdout   []byte
	Stderr   []byte
}

// Hypervisor is the narrow interface the executor and observers drive. One
// value serves every zone of one hypervisor installation. Every method
// takes a context and must return when it is done; adapters whose client
// takes no context wrap the call and treat a timed-out call as a broken
// connection.
//
// Every mutating method is an ensure: calling it again after a crash at any
// point converges on the same VMs and volumes instead of duplicating them,
// and it adopts an existing object only if it carries our marker.
type Hypervisor interface {
	Shape() Shape
	// Zones lists the configured zones (libvirt hosts, Proxmox nodes).
	Zones() []string
	// Observe lists one zone. An error means the zone is unknown.
	Observe(ctx context.Context, zone string) (*observed.Zone, error)
	// Lookup re-reads one VM (ErrNotFound if it does not exist).
	Lookup(ctx context.Context, t Target) (*observed.VM, error)

	// libvirt shape.
	CreateOverlay(ctx context.Context, zone string, spec OverlaySpec) error
	CreateSeed(ctx context.Context, zone string, spec SeedSpec) error
	DefineDomain(ctx context.Context, zone string, spec DomainSpec) error
	UndefineDomain(ctx context.Context, t Target) error
	DeleteVolume(ctx context.Context, zone, pool, name string) error

	// Proxmox shape. CloneVM returns the VMID of the (new or adopted) clone.
	CloneVM(ctx context.Context, zone string, spec CloneSpec) (int, error)
	ConfigureVM(ctx context.Context, t Target, spec SizeSpec) error
	DeleteVM(ctx context.Context, t Target) error

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

// HealthReporter is implemented by adapters that track per-zone
// connection health; it feeds /readyz detail and metrics.
type HealthReporter interface {
	// ZoneHealth maps each zone to nil (healthy) or why it is not.
	ZoneHealth() map[string]error
}

// Unsupported implements the operations of the other shape by returning
// ErrUnsupported; adapters embed it.
type Unsupported struct{}

func (Unsupported) CreateOverlay(context.Context, string, OverlaySpec) error { return ErrUnsupported }
func (Unsupported) CreateSeed(context.Context, string, SeedSpec) error       { return ErrUnsupported }
func (Unsupported) DefineDomain(context.Context, string, DomainSpec) error   { return ErrUnsupported }
func (Unsupported) UndefineDomain(context.Context, Target) error             { return ErrUnsupported }
func (Unsupported) DeleteVolume(context.Context, string, string, string) error {
	return ErrUnsupported
}
func (Unsupported) CloneVM(context.Context, string, CloneSpec) (int, error) {
	return 0, ErrUnsupported
}
func (Unsupported) ConfigureVM(context.Context, Target, SizeSpec) error { return ErrUnsupported }
func (Unsupported) DeleteVM(context.Context, Target) error              { return ErrUnsupported }
