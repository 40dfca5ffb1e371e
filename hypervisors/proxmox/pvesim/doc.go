// Package pvesim is an in-process Proxmox VE API simulator: an HTTPS server
// speaking the /api2/json subset that github.com/luthermonson/go-proxmox
// uses for cloning, configuring, powering and destroying QEMU VMs, tasks,
// permissions and the guest agent, so the real client can be tested over
// real TLS.
//
// Invariants tests may rely on:
//   - Quirks of real PVE are reproduced, not smoothed over: UPIDs have the
//     9-field form "UPID:node:pid:pstart:starttime:type:id:user:", errors
//     travel in the HTTP reason phrase ("500 VM 101 already exists on node
//     'pve1'"), /cluster/nextid returns a JSON string, "template" is only
//     present for templates, exec-status carries exited/exitcode/out-data/
//     err-data with booleans as 1/0.
//   - VMIDs are unique across the cluster; a clone onto a used VMID fails.
//   - Tasks take time (Latencies, scaled by LatencyScale); while a task on a
//     VM runs, every other mutation of that VM fails with PVE's lock error
//     ("can't lock file '/var/lock/qemu-server/lock-<vmid>.conf' - got
//     timeout"), returned at once instead of after PVE's 10 s wait.
//   - Every request needs "Authorization: PVEAPIToken=USER@REALM!ID=SECRET"
//     (401 otherwise); privileges are checked per token and path like PVE
//     (ACLs propagate down the path tree, /pool/<p> covers its members), a
//     missing one is a 403 naming the path and privilege.
//   - Faults are injected through the Faults API only; nothing is random.
//   - The guest agent of each VM is an in-memory Guest by default
//     (MemGuest), or a real qemu-ga on a unix socket (QGAGuest).
package pvesim
