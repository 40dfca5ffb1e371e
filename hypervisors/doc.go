// Package hypervisors is the runtime contract between the core (the
// executor, the reconciler, metrics, server) and the hypervisor
// plug-ins: a common interface (Hypervisor: observe, look up, power,
// marker, guest agent, and Apply for the steps of the hypervisor's own
// vocabulary), what a step is (StepParams, ActionInfo), the optional
// parts an adapter may add (Capabilities: events, direct volume reads,
// zone health, host capacity, the simulator's admin) and the error
// classes adapters map raw errors to. The plug-ins live below it, one
// room each: libvirt (vocabulary in libvirt/lvspec) and proxmox
// (proxmox/pvespec, its marker encoding in proxmox/pvemarker); fake holds
// their simulators, mem a test-only third hypervisor. The guest-agent
// protocol all of them share lives once, in guest.
//
// Where things are: hypervisors.go (Target, the Hypervisor interface),
// step.go (Effect, ActionInfo, StepParams, Applier), exec.go (a guest
// command's result), optional.go (optional interfaces, among them
// CapacityReader and its HostCapacity, Simulator, Capabilities and Find),
// events.go (change events), errors.go (error classes, Retryable).
//
// Invariants:
//   - No go-libvirt or go-proxmox type crosses this package's API.
//   - An adapter's Apply performs the steps of exactly its vocabulary;
//     params of another are ErrUnsupported, terminal.
//   - A wrapper is one type whatever it wraps: it declares its optional
//     parts (Capabilities: passed through, or replaced by its own), and
//     Find and CapabilitiesOf read them; no type per combination.
//   - The marker (observed.Marker) is the only proof of ownership; a name
//     alone never is.
package hypervisors
