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
//     present for templates, exec-status carries exited, exitcode (or
//     signal), out-data/err-data and their truncation flags with booleans
//     as 1/0, as PVE passes on a current qemu-ga's answer.
//   - Answers have the JSON shape of real PVE 8 and 9 answers: the keys,
//     JSON types and nesting of go-proxmox's recorded PVE answers (held by
//     shape_test.go, which lists every deliberate difference and why).
//     Keys PVE sends only in some situations follow qemu-server: "pid" and
//     the QMP-derived statistics only while a VM runs, "agent" only when
//     enabled, tags/lock/template/pool only when set; GET /nodes/{node}/qemu
//     lists vmstatus() without QMP data (no qmpstatus, ha or agent).
//   - VMIDs are unique across the cluster; a clone onto a used VMID fails.
//   - Tasks take time (Latencies, scaled by LatencyScale); while a task on a
//     VM runs, every other mutation of that VM fails with PVE's lock error
//     ("can't lock file '/var/lock/qemu-server/lock-<vmid>.conf' - got
//     timeout"), returned at once instead of after PVE's 10 s wait.
//   - Every request needs "Authorization: PVEAPIToken=USER@REALM!ID=SECRET"
//     (401 otherwise); privileges are checked per token and path like PVE
//     (ACLs propagate down the path tree, /pool/<p> covers its members), a
//     missing one is a 403 naming the path and privilege.
//   - Nodes and storages have a configurable size (Options.Host,
//     Options.Storages). A VM's disk lives on a named storage (scsi0 is
//     "<storage>:vm-<vmid>-disk-0,size=8G"); a full clone lands on the
//     "storage" parameter or else on its source's storage and takes
//     CloneDiskBytes of it (of the clone's node, or of the one pool of a
//     shared storage) until the clone is gone; a clone that does not fit
//     fails its task with qemu-img's "No space left on device".
//   - Faults are injected through the Faults API only; nothing is random.
//   - The guest agent of each VM is an in-memory Guest by default
//     (MemGuest, over a guestsim.Guest), or a real qemu-ga on a unix socket
//     (QGAGuest).
package pvesim
