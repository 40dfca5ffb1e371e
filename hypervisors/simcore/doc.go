// Package simcore is the machinery the in-process hypervisor simulators
// share, whatever hypervisor they simulate: the world lock, call counters,
// per-call hooks (Hook, FailN, Chain), reachability (SetUnreachable),
// flapping calls (SetFlaky), latency, the journal of the world (Store,
// StatePrefix), the simulated guest agent of every VM, the configured host
// capacity, the checks of out-of-band values and the conformance faults.
// Each hypervisor's room owns its simulator and builds it over a Core
// (hypervisors/libvirt/libvirtsim, hypervisors/proxmox/proxmoxsim); this
// package imports neither room, and simtest runs the behaviour they share
// against each of them.
//
// A simulator keeps a world and a guest agent per VM, and answers each
// call the way the real system would from that world: nothing is scripted
// per call. Tests steer it only through the world (the simulator's
// out-of-band methods such as StopVM, RemoveVM, AddForeignVM), Options
// (Latency, AgentDelay, Faults) and per-call hooks (Hook, FailN,
// SetUnreachable, SetFlaky: one kind of call on a zone fails transiently).
// Options holds the settings every simulator shares; each room's own
// Options (libvirtsim.Options, proxmoxsim.Options) embeds it next to its
// hypervisor's settings, which this package never sees.
//
// The simulated guest agent answers once the VM has been running for
// Options.AgentDelay (never while stopped or paused). Its guest is a
// guestsim.Guest and every agent method goes through the protocol of
// package guest, as the real adapters do: AgentExec starts the command
// once and polls its pid, AgentWriteFile writes private parts and renames
// them into place. The guest runs the protocol's helper scripts and:
//   - the bootstrap hook: argv[0] == Options.BootstrapHook (libvirt,
//     argv[1] is the cluster, the blob is read from Options.BlobPath), or
//     an argv ending in Options.BootstrapPath (Proxmox --bootstrap-exec,
//     the cluster is the marker's). It exits 0 and records a Bootstrap when
//     the blob file exists, else exits 1 with a "No such file" stderr;
//   - a drain: Options.DrainCommand, or an argv mentioning "kubectl" and
//     "drain" (exit 0);
//   - Options.ReadyCommand: exit 0 once the guest was bootstrapped, else
//     exit 1 "node not Ready";
//   - anything else: exit 127 "command not found".
//
// The hook and the drain run for Options.Latency (their effects happen
// when they start); stopping the VM reboots its guest (processes die,
// /run and /tmp are emptied).
//
// Faults: an error from the "AgentExec" hook (and from the other agent
// methods' hooks) means the call never reached the guest; the wire's own
// requests run the AgentExecOp, AgentStatusOp and AgentWriteOp hooks, and
// ExecAnswerOp runs when a status answer is about to report a command's
// exit: an error from it loses that answer (the agent has forgotten the
// pid), so a plain AgentExec returns ErrOutcomeUnknown and the effects
// stay. A blocking command ended by ctx is ErrOutcomeUnknown.
// GuestState.Starts counts the commands started.
//
// With Options.Faults the marker's Cluster selects a conformance fault
// (FaultError, FaultTimeout, FaultSlowOK, FaultDrainError,
// FaultReadinessBlock), and CreateFaultLabel=error in the labels of a
// create fails it with ErrInvalid (Core.CreateFault).
//
// Invariants every simulator built on a Core keeps, and callers may rely
// on:
//   - Every mutating call is an ensure with the semantics of the interface:
//     repeating it converges on the same objects and never duplicates them;
//     an object is adopted only when it carries the same installation and
//     machine id in its marker, otherwise the call fails with ErrExists.
//   - Errors wrap exactly one hypervisors error class (or a context error
//     when ctx ended while the call would block).
//   - Observe output is deterministic (each simulator says its order).
//   - Returned values never alias the simulator's memory.
//   - All methods are safe for concurrent use. Latency and blocking guest
//     commands never hold the world lock, so one slow call does not stall
//     others.
//   - With Options.Store every change of a VM or volume is journaled as one
//     record under StatePrefix (Core.Persist) while the world lock is held,
//     each simulator under its own key prefix, so the journal
//     holds the changes in order; the provider shares its state store, so
//     a crash can never leave the desired document ahead of the world.
//   - One guest-agent request is journaled as one record of its VM: the
//     effects of a command it ran (a drain, a bootstrap's join) and the
//     wrapper's record of that command's start and end are durable
//     together, as a real wrapper makes "started" durable before the
//     command runs. A crash therefore never leaves a command that ran
//     without its record, which would run it again.
//   - The journaled world never contains file contents written through the
//     guest agent, so the bootstrap blob never reaches disk: a guest's
//     files are journaled as mode, SHA-256 and size (guestsim.State), and
//     bootstrap history keeps only its SHA-256 and size.
package simcore
