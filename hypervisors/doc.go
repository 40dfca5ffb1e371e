// Package hypervisors is the contract between the executor, the
// reconciler and the hypervisor adapters: a small common interface
// (Hypervisor: observe, look up, power, marker, guest agent), the steps
// of each shape (LibvirtSteps, ProxmoxSteps) and their parameters, the
// optional interfaces an adapter may add (events, direct volume reads,
// zone health) and the error classes adapters map raw errors to. The
// adapters live below it: fake (in-memory simulators of both shapes),
// libvirt (go-libvirt) and proxmox (go-proxmox, with its marker encoding
// in proxmox/pvemarker); names come from package naming. The guest-agent
// protocol all of them share lives once, in guest.
//
// Where things are: hypervisors.go (Shape, Target, the interfaces the
// executor drives), steps.go (the step vocabulary), exec.go (a guest
// command's result), optional.go (optional interfaces, among them
// CapacityReader and its HostCapacity, Capabilities and Find), events.go
// (change events), errors.go (error classes, Retryable).
//
// Invariants:
//   - No go-libvirt or go-proxmox type crosses this package's API.
//   - An adapter implements Hypervisor and the steps of exactly its shape;
//     a step of the other shape is the executor's ErrUnsupported.
//   - A wrapper is one type whatever it wraps: it declares its optional
//     parts (Capabilities: passed through, or replaced by its own), and
//     Find and CapabilitiesOf read them; no type per combination.
//   - The marker (observed.Marker) is the only proof of ownership; a name
//     alone never is.
package hypervisors
