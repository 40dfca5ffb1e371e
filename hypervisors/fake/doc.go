// Package fake simulates a libvirt host set (Libvirt) and a Proxmox cluster
// (Proxmox) in memory behind hypervisors.Hypervisor and the steps of each
// one's shape, for `provider --use-fake-backend`, golden plan tests and
// unit tests.
//
// The simulators keep a world (hosts, pools, volumes, domains; nodes,
// templates, VMs, tasks, config locks) and a guest agent per VM, and answer
// each call the way the real system would from that world: nothing is
// scripted per call. Tests steer them only through the world (the
// out-of-band methods such as StopVM, RemoveVM, AddForeignVM), options
// (Latency, AgentDelay, Faults) and per-call hooks (Hook, FailN,
// SetUnreachable, SetFlaky: one kind of call on a zone fails transiently).
//
// The simulated guest agent answers once the VM has been running for
// Options.AgentDelay (never while stopped or paused). AgentExec knows:
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
// AgentExec keeps the interface's at-most-once contract: an error from
// the "AgentExec" hook means the command never started; ExecAnswerOp runs
// after the command ran, and an error from it loses the answer
// (ErrOutcomeUnknown, the effects stay); a blocking command ended by ctx
// is ErrOutcomeUnknown. GuestState.Starts counts the commands started.
//
// With Options.Faults the marker's Cluster selects a conformance fault
// (FaultError, FaultTimeout, FaultSlowOK, FaultDrainError,
// FaultReadinessBlock), and CreateFaultLabel=error in DomainSpec.Labels or
// CloneSpec.Labels fails the create with ErrInvalid.
//
// Invariants callers may rely on:
//   - Every mutating call is an ensure with the semantics of the interface:
//     repeating it converges on the same objects and never duplicates them;
//     an object is adopted only when it carries the same installation and
//     machine id in its marker, otherwise the call fails with ErrExists.
//   - Errors wrap exactly one hypervisors error class (or a context error
//     when ctx ended while the call would block).
//   - Observe output is deterministic: VMs sorted by name (libvirt) or VMID
//     (Proxmox), volumes by name, tags sorted.
//   - Returned values never alias the simulator's memory.
//   - All methods are safe for concurrent use. Latency and blocking guest
//     commands never hold the world lock, so one slow call does not stall
//     others.
//   - With Options.Store every change of a VM or volume is journaled as one
//     record under StatePrefix while the world lock is held, so the journal
//     holds the changes in order; the provider shares its state store, so
//     a crash can never leave the desired document ahead of the world.
//   - The journaled world never contains file contents written through the
//     guest agent, so the bootstrap blob never reaches disk; bootstrap
//     history keeps only its SHA-256 and size.
//   - A Proxmox VMID is unique across the cluster and allocated from 100
//     upwards by the simulator itself, with retry when a concurrent clone
//     took the candidate first.
package fake
