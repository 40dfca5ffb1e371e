// Package hypervisors defines the narrow interface the executor drives and
// the error classes adapters map raw errors to, plus the naming and marker
// rules every adapter shares. The adapters live below it: fake (in-memory
// simulators of both shapes), libvirt (go-libvirt) and proxmox (go-proxmox).
//
// Invariants:
//   - No go-libvirt or go-proxmox type crosses this package's API.
//   - Names are a pure function of (installation, machine id, cycle), so a
//     re-run after a crash finds the same objects instead of making new ones.
//   - The marker is the only proof of ownership; a name alone never is.
package hypervisors
