// Package executor applies a machine's planned steps to a hypervisor:
// in dependency order (Step.DependsOn), independent steps concurrently,
// with per-zone concurrency bounds on the steps that load a host,
// deadlines from the transition, and retries (retry.Step) by error class:
// the retryable classes are retried until the deadline, terminal ones are
// not. Adapters do not retry what the executor retries.
//
// Invariants:
//   - Every step is an ensure; re-running a change after a crash converges.
//   - A step starts only after every step it depends on succeeded; the
//     first step that fails terminally cancels the others, and no step
//     starts after it. A change whose dependencies name a missing step or
//     form a cycle is rejected (ErrInvalid) before anything runs. A value
//     a step learns (the VMID of a clone) reaches the steps that depend on
//     it, directly or not.
//   - One leader: Options.Guard is asked before every attempt that
//     touches a hypervisor or a guest (retries included, through
//     retry.Policy.Before); once it refuses, the step ends without another
//     attempt. A replica that lost its term leaves even the blob's removal
//     to nobody rather than act on a guest the next leader now drives.
//   - Repairs end: a change without an operation gets at most
//     Options.RepairAttempts attempts per step (its deadline is the
//     caller's), so a failing repair returns to the caller's backoff
//     instead of holding a worker.
//   - At most once in the guest, across restarts and fail-overs: the
//     bootstrap hook and the drain run under the guest-op wrapper
//     (guest.Run, keyed by the operation id), after Options.ExecStarting
//     (if set) accepted them; whoever runs the step again follows the
//     guest's record of the command (finished: its outcome; running:
//     waited for; never started: run) instead of starting it again. An
//     unknown outcome (ErrOutcomeUnknown) fails the step only when the
//     record says the hook started and died without an end; the drain,
//     idempotent, runs again then. The readiness probe runs under the
//     wrapper as a repeatable check: never two at once for an operation.
//   - The bootstrap blob is staged in the guest as the Run starts; a Run
//     without it (a leader that took over) runs the hook with the blob an
//     earlier leader staged, waits up to Options.BlobGrace for a retry of
//     the Configure to bring it back, or fails with BlobNeverDelivered.
//   - The executor never asks which hypervisor it drives: a step's
//     ActionInfo (planner.Step.Info) says whether it is heavy (bounded per
//     zone) and whether it needs an owner check; core actions call the
//     Hypervisor's methods, a plug-in step goes to Hypervisor.Apply, which
//     refuses params of another vocabulary with ErrUnsupported, terminal.
//   - A step whose ActionInfo asks for an owner check re-reads the live VM
//     immediately before acting and refuses unless it carries this
//     installation's marker for the machine.
//   - The bootstrap blob is read from memory at the moment it is written to
//     the guest; it never reaches logs, errors or last_error (hook output is
//     bounded and scrubbed of it, or withheld when the blob is not in
//     memory), and it is removed from the guest afterwards, even when the
//     hook failed or the deadline passed, unless the Run's caller cancelled
//     it or the term ended (the next leader may need the staged blob).
package executor
