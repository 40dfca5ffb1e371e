// Package guest runs commands and writes files in a VM's guest through
// its guest agent: the one home of the at-most-once guest-command
// protocol, which both adapters and the simulator use over the narrow
// Transport each implements (libvirt's QGA passthrough, Proxmox's agent
// endpoints, the simulator's in-memory agent).
//
// Agent is the protocol: Exec sends one start request and then polls the
// pid; WriteFile writes private part files and renames the result into
// place; RemoveFile and Ping. A Transport makes each request once and
// says only what its wire can know (Refused, ErrPIDGone); every retry and
// poll, and every decision about whether a command may have run, is made
// here.
//
// Run is the recorded command on top of it, what a restart or fail-over
// relies on: the command runs under Script, a POSIX sh wrapper delivered
// through the file write, which claims it per boot under its operation's
// key and records in the guest, durably, that it started and how it
// ended; Run follows that record (exited, running, never started, dead,
// lost), so whoever runs an operation again completes it instead of
// running its command twice. A file the command needs (the bootstrap
// blob) is staged first and put in place by the wrapper.
//
// Invariants callers may rely on:
//   - Exec sends a command's start request at most once. Its error says
//     whether the command may have run: a Retryable class only when the
//     transport proved it never started (Refused); an
//     *hypervisors.UnknownOutcomeError when it may have started and its
//     end cannot be learned (start request unanswered, pid forgotten by
//     the agent, status unreadable, ctx ended while it ran).
//   - An exit status is never lost over its output: undecodable output is
//     replaced by a note, and a signal is reported as 128+signal.
//   - WriteFile is atomic and private: a reader sees the old file or the
//     whole new one, and the data is only ever in 0600 files until the
//     final chmod. It is idempotent; the protocol's own helper commands
//     (PrepareScript, CommitScript, rm) are safe to repeat, so their
//     unknown outcomes are ErrTransient, never ErrOutcomeUnknown.
//   - Data written and command arguments never appear in errors; agent
//     text in errors is bounded by the transport.
//   - A recorded command starts at most once per key, whoever sends its
//     wrapper and however often: a second wrapper for the key reports
//     instead of running; "started" is durable (fsync, rename, fsync of
//     the directory) before the command starts, so after a guest crash a
//     missing record proves it never ran; a key whose claimant died before
//     starting is superseded durably before a new attempt runs. Only an
//     idempotent command (Op.Rerun) ever runs again, and only after the
//     record proves its previous run died.
//
// Subpackages: guestsim (an in-memory guest and qemu-ga for simulators
// and tests) and guesttest (the protocol's test suite, run against each
// adapter's transport).
package guest
