package guest

import (
	"context"
	"errors"
)

// Transport is one VM's guest agent as a hypervisor reaches it: the few
// requests both libvirt's QGA passthrough (guest-exec, guest-exec-status,
// guest-file-open/write/close, guest-ping) and Proxmox's agent endpoints
// (agent/exec, agent/exec-status, agent/file-write, agent/ping) can make.
// Each method makes its request once and never retries; Agent owns every
// retry and poll, so that at most once is decided in one place.
//
// Errors carry the hypervisors error classes (hypervisors.ErrTransient,
// ErrAgentNotReady, ErrPermission, ...), plus what only the transport can
// know:
//   - Exec: an error marked with Refused proves the command never started
//     (the request never left, or the hypervisor or the agent refused it
//     before spawning anything). Any other error means it may have
//     started.
//   - Status: an error wrapping ErrPIDGone means the agent answered that
//     it does not know the pid (it restarted, or it already reported the
//     exit and forgot the process).
type Transport interface {
	// Ping succeeds when the agent answers; ErrAgentNotReady while it is
	// not connected or the VM is not running.
	Ping(ctx context.Context) error
	// Exec sends one start request for argv (argv[0] is the program, by
	// absolute path or looked up in the guest's PATH) with its output
	// captured, and returns the pid the agent reported (0 if the reply
	// carried none).
	Exec(ctx context.Context, argv []string) (pid int, err error)
	// Status sends one status request for pid.
	Status(ctx context.Context, pid int) (Status, error)
	// Write makes data the whole content of path (created, or truncated
	// keeping its mode). len(data) is at most MaxWrite. The data never
	// appears in an error.
	Write(ctx context.Context, path string, data []byte) error
	// MaxWrite is the most one Write carries (0: no limit).
	MaxWrite() int
}

// Status is one answer about a started process, with its output decoded.
type Status struct {
	Exited bool
	// ExitCode is the exit status of a process that exited; Signal, if
	// not 0, is the signal that killed it instead.
	ExitCode int
	Signal   int
	Stdout   []byte
	Stderr   []byte
}

// ErrPIDGone is the agent's answer that it does not know a pid.
var ErrPIDGone = errors.New("the guest agent does not know the pid")

// refused marks a start request that provably did not start anything.
type refused struct{ err error }

func (r *refused) Error() string { return r.err.Error() }
func (r *refused) Unwrap() error { return r.err }

// Refused marks err, a failed Exec request, as proof that the command
// never started. Its classes are kept. Refused(nil) is nil.
func Refused(err error) error {
	if err == nil {
		return nil
	}
	return &refused{err}
}

// IsRefused reports whether err is marked with Refused.
func IsRefused(err error) bool {
	var r *refused
	return errors.As(err, &r)
}
