// Package naming derives the names of the VMs the provider creates, and
// the slug rule that turns installation and machine ids into name parts.
// A hypervisor names what a VM owns from the VM's name, in its own room
// (libvirt's volumes: lvspec.OverlayVolume, lvspec.SeedVolume).
//
// Invariants:
//   - Names are a pure function of (installation, machine id, cycle), so a
//     re-run after a crash finds the same objects instead of making new
//     ones, and a recreated slot (a new cycle) never reuses a name a
//     leaked VM may hold.
//   - A VM name is at most 63 bytes of [a-z0-9-] (a DNS label, a Proxmox
//     VM name, a hostname); two machine ids that slug alike still get
//     different names (a hash of the exact ids is part of the name).
//   - Every VM name starts with Prefix.
//   - A name alone never proves ownership: the marker does.
//
// It imports nothing of the provider, so desired (through the server),
// the planner, the adapters and the simulators share one rule.
package naming
