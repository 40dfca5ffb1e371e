// Package proxmox implements hypervisors.Hypervisor (ShapeProxmox) for a
// Proxmox VE cluster through github.com/luthermonson/go-proxmox: one Adapter
// per cluster, each configured node a zone.
//
// Invariants:
//   - The API is reached over https only, with the server verified by a CA
//     file and/or a pinned leaf SHA-256 fingerprint (both must pass when
//     both are set). The token secret and bootstrap data never appear in
//     logs or errors.
//   - Ownership is the installation tag set (hypervisors.HasOwnershipTags)
//     AND a description marker (hypervisors.ParseDescription) naming this
//     installation. A VM whose name merely looks like ours is foreign.
//     Stop, DeleteVM, ConfigureVM and SetMarker re-read the live VM and
//     refuse (ErrNotOwned) to act on anything else.
//   - VMIDs come from an in-process allocator seeded by /cluster/nextid; a
//     collision ("already exists") moves to the next free id, and a VM
//     already carrying our marker for the machine is adopted instead of
//     cloned again.
//   - A task counts as done only when it stopped with exit status "OK"
//     (go-proxmox's Wait returns nil for failed tasks).
//   - Observe costs one /cluster/resources listing per tick (shared by the
//     zones observed within ListingTTL) plus one config read per owned VM
//     whose listing fingerprint changed, that this adapter changed, or
//     whose cached config is older than ConfigTTL.
//   - Every API request is made once: the executor retries steps by error
//     class, so attempts never multiply. Only progress is polled (tasks, a
//     clone's lock, a guest process) at Config.PollMin..PollMax.
//   - AgentExec sends the exec request once and polls exec-status until
//     exit or ctx; it returns a retryable class only when PVE refused the
//     request before asking the agent (or it never left), and
//     ErrOutcomeUnknown when the command may have run.
//   - Errors are classified with the hypervisors error classes: lock
//     errors → ErrLocked, 5xx/timeouts → ErrTransient, 401/403 →
//     ErrPermission (never retried), "does not exist" → ErrNotFound,
//     network failures → ErrUnreachable, "guest agent is not running" →
//     ErrAgentNotReady.
package proxmox
