package simcore

import (
	"context"
	"sync"

	"github.com/bigfleet-vm/provider/hypervisors"
)

// Call describes one hypervisor call as a Hook sees it. Op is the
// interface method name ("DefineDomain", "CloneVM", "AgentExec",
// "Observe", ...), a request of the simulated guest agent's wire
// (AgentExecOp, AgentStatusOp, AgentWriteOp, "agent/ping"), ExecAnswerOp
// for the answer that reports a guest command's exit, or, for the
// completion of a Proxmox task, "task/" plus the task type
// ("task/qmclone", "task/qmstart", ...).
type Call struct {
	Op     string
	Zone   string
	Target hypervisors.Target
	// Argv is the command of an AgentExec or AgentExecOp call.
	Argv []string
}

// Hook runs before a call is performed (in the style of controller-runtime's
// client interceptors); a non-nil error is returned instead of performing
// the call. For a task a non-nil error fails the task with that message.
type Hook func(ctx context.Context, call Call) error

// FailN returns a Hook that fails the first n calls of op with err and
// lets every other call through. It is safe for concurrent use.
func FailN(op string, n int, err error) Hook {
	var mu sync.Mutex
	left := n
	return func(_ context.Context, c Call) error {
		if c.Op != op {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		if left <= 0 {
			return nil
		}
		left--
		return err
	}
}

// Chain runs hooks in order and returns the first error.
func Chain(hooks ...Hook) Hook {
	return func(ctx context.Context, c Call) error {
		for _, h := range hooks {
			if h == nil {
				continue
			}
			if err := h(ctx, c); err != nil {
				return err
			}
		}
		return nil
	}
}
