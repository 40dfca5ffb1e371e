package hypervisors

import (
	"errors"
	"fmt"
	"strings"
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
	// ErrUnsupported: the hypervisor has no such operation, e.g. a step
	// of the other shape (terminal).
	ErrUnsupported = errors.New("unsupported by this hypervisor")
	// ErrOutcomeUnknown: a guest command may have started, and whether or
	// how it ended cannot be learned (the start request went unanswered,
	// the deadline passed while it ran, or the agent forgot its pid).
	// Terminal: sending it again could run it twice.
	ErrOutcomeUnknown = errors.New("outcome unknown")
)

// Retryable reports whether an error is of a transient class. An
// ErrOutcomeUnknown or ErrNoResources is never retryable, whatever else
// its chain holds.
func Retryable(err error) bool {
	if errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, ErrNoResources) {
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

// ErrNoResources: the host lacks the memory or storage space the request
// needs (terminal: retrying does not make room). Adapters report it as a
// *ResourceError naming the resource.
var ErrNoResources = errors.New("host out of resources")

// ResourceError is a hypervisor's refusal for lack of host resources:
// Resource is "memory" or "disk" (the capacity package's names), Err the
// hypervisor's own error.
type ResourceError struct {
	Resource string
	Err      error
}

func (e *ResourceError) Error() string {
	return fmt.Sprintf("%s: %v: %v", e.Resource, ErrNoResources, e.Err)
}

// Unwrap makes errors.Is(err, ErrNoResources) hold, and the cause's
// classes other than a retryable one.
func (e *ResourceError) Unwrap() []error { return []error{ErrNoResources, e.Err} }

// resourceMessages are the fragments of a hypervisor's message that say a
// host resource ran out (lower case), with the resource. qemu, libvirt's
// storage backends and Proxmox's tasks all pass the kernel's ENOMEM and
// ENOSPC texts through.
var resourceMessages = []struct{ fragment, resource string }{
	{"cannot allocate memory", "memory"},
	{"out of memory", "memory"},
	{"not enough memory", "memory"},
	{"no space left on device", "disk"},
	{"not enough space", "disk"},
	{"not enough free space", "disk"},
	{"insufficient space", "disk"},
	{"insufficient free space", "disk"}, // LVM: a volume group out of extents (thick local-lvm)
	{"disk quota exceeded", "disk"},
}

// ResourceOf returns the resource ("memory" or "disk") a hypervisor's
// error message says ran out, or "".
func ResourceOf(msg string) string {
	msg = strings.ToLower(msg)
	for _, m := range resourceMessages {
		if strings.Contains(msg, m.fragment) {
			return m.resource
		}
	}
	return ""
}
