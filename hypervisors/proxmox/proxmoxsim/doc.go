// Package proxmoxsim simulates a Proxmox VE cluster (Proxmox) in memory
// behind hypervisors.Hypervisor and pvespec.Steps, for the Proxmox
// plug-in's --use-fake-backend, golden plan tests and unit tests. It is
// the Proxmox room's in-process simulator, built over the shared machinery
// of package simcore (the world lock, hooks, latency, the journal, the
// simulated guest agent and the conformance faults, all described there);
// the libvirt room has its own (libvirtsim). It is not pvesim, which
// serves the Proxmox HTTP API to the real go-proxmox client: this one is
// called in process, as the executor calls an adapter.
//
// Each zone is a node of one cluster with a cluster-wide VMID space,
// templates (Options.TemplateVMID on the first node, Options.Templates),
// clone/start/stop/destroy tasks that run for Options.Latency and hold the
// VM's config lock while they run (the Hook sees each completion as
// "task/<type>"), and the ownership marker in the VM's description and
// tags (package pvemarker). Tests steer the world out of band (StopVM,
// CrashVM, PauseVM, ResizeVM, SetLock, RemoveVM, AddOwnedVM,
// AddForeignVM).
//
// Invariants, beside simcore's:
//   - Observe lists a node's VMs, templates included, sorted by VMID; a
//     marker is observed only when the tags carry the ownership tags of the
//     installation the description names. Tags are sorted.
//   - A VMID is unique across the cluster and allocated from FirstVMID
//     upwards by the simulator itself, with retry when a concurrent clone
//     took the candidate first.
//   - The world is journaled under simcore.StatePrefix as one record per VM
//     ("px/vm/<vmid>"); tasks and their locks do not survive a reload.
package proxmoxsim
