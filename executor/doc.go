// Package executor applies a machine's planned steps to a hypervisor:
// in dependency order, with per-host concurrency bounds on the steps that
// load a host, deadlines from the transition, retries with jittered
// backoff for transient error classes and none for terminal ones.
//
// Invariants:
//   - Every step is an ensure; re-running a change after a crash converges.
//   - A destructive step re-reads the live VM immediately before acting and
//     refuses unless it carries this installation's marker for the machine.
//   - The bootstrap blob is read from memory at the moment it is written to
//     the guest; it never reaches logs, errors or last_error (hook output is
//     bounded and scrubbed of it), and the file is removed afterwards.
package executor
