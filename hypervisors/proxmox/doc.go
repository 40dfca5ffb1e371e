// Package proxmox implements hypervisors.Hypervisor and
// pvespec.Steps (the Proxmox vocabulary, through Apply) for a Proxmox VE cluster through
// github.com/luthermonson/go-proxmox: one Adapter per cluster, each
// configured node a zone. The marker encoding is in pvemarker, the API
// simulator for tests and demos in pvesim.
//
// Invariants:
//   - The API is reached over https only, with the server verified by a CA
//     file and/or a pinned leaf SHA-256 fingerprint (both must pass when
//     both are set). The token secret and bootstrap data never appear in
//     logs or errors.
//   - Ownership is the installation tag set (pvemarker.HasOwnershipTags)
//     AND a description marker (pvemarker.ParseDescription) naming this
//     installation. A VM whose name merely looks like ours is foreign.
//     Stop, DeleteVM, ConfigureVM and SetMarker re-read the live VM and
//     refuse (ErrNotOwned) to act on anything else.
//   - VMIDs come from an in-process allocator seeded by /cluster/nextid; a
//     collision ("already exists") moves to the next free id, and a VM
//     already carrying our marker for the machine is adopted instead of
//     cloned again.
//   - A task counts as done only when it stopped with exit status "OK"
//     (go-proxmox's Wait returns nil for failed tasks).
//   - Every listing is one GET /cluster/resources without a type filter
//     (VMs and node statuses at once), decoded by the adapter itself (see
//     fetch: half the CPU of go-proxmox's decoding) and serialised so
//     concurrent callers share one. A listing younger than ListingTTL serves Observe, unless
//     this adapter changed something since it was sent or a later poll
//     failed. Observe costs that listing plus one config read per owned VM
//     whose listing fingerprint changed, that this adapter changed, or
//     whose cached config is older than ConfigTTL. A node the cluster does
//     not list online is observed as unknown.
//   - The poller (on unless PollInterval < 0; stopped by Close) makes at
//     most one listing per PollInterval, bounded by PollTimeout, and with
//     an unchanged cluster pushes no event. It pushes an EventVM (zone =
//     node, VM = name, MachineID when the adapter knows the marker) for
//     each VM carrying this installation's ownership tags, before or now,
//     that appeared, vanished, or changed power, name, tags, size, pool or
//     node; the first listing is the baseline. VMs on a node that is not
//     online keep their last state (the node's EventZoneDown covers them).
//   - ZoneHealth: each node is "connecting" until the first poll ends, up
//     while the last poll listed it online, and "down since <t>: <reason>"
//     when the cluster lists it otherwise, when the last poll failed (all
//     nodes), or while a poll has been unanswered for StallAfter (all
//     nodes). The reason never names the node nor holds the token secret.
//     EventZoneUp and EventZoneDown are pushed when a node becomes or
//     stops being up.
//   - Every API request is made once: the executor retries steps by error
//     class, so attempts never multiply. Only progress is polled (tasks, a
//     clone's lock, a guest process) at Config.PollMin..PollMax.
//   - The guest agent is reached through package guest's protocol over
//     PVE's agent endpoints (agent.go is the transport only): AgentExec
//     sends the exec request once and polls exec-status until exit or ctx;
//     it returns a retryable class only when PVE refused the request before
//     asking the agent (or it never left), and ErrOutcomeUnknown when the
//     command may have run. QGA's "Invalid parameter 'pid'" is the one
//     answer read as a forgotten pid.
//   - Errors are classified with the hypervisors error classes: lock
//     errors → ErrLocked, 5xx/timeouts → ErrTransient, 401/403 →
//     ErrPermission (never retried), "does not exist" → ErrNotFound,
//     network failures → ErrUnreachable, "guest agent is not running" →
//     ErrAgentNotReady.
package proxmox
