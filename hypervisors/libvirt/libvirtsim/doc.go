// Package libvirtsim simulates a libvirt host set (Libvirt) in memory
// behind hypervisors.Hypervisor and lvspec.Steps, for the libvirt
// plug-in's --use-fake-backend, golden plan tests and unit tests. It is
// the libvirt room's in-process simulator, built over the shared
// machinery of package simcore (the world lock, hooks, latency, the
// journal, the simulated guest agent and the conformance faults, all
// described there); the Proxmox room has its own (proxmoxsim).
//
// Each zone is a host with the storage pool Options.Pool holding the base
// image Options.Image, the network Options.Network, and domains. Volumes
// are overlays backed by the base image and NoCloud seed ISOs; a domain
// starts only when its disks, their backing image and its network exist.
// Tests steer the world out of band (StopVM, CrashVM, PauseVM, ResizeVM,
// RemoveVM, RemoveVolume, AddOwnedVM, AddForeignVM, AddBlankSeedVolume).
//
// Invariants, beside simcore's:
//   - Observe lists a host's domains sorted by name and the volumes of
//     Options.Pool that carry lvspec.VolumePrefix, sorted by name.
//   - A volume without lvspec.VolumePrefix is never deleted by a call
//     (ErrNotOwned), nor one attached to a running or paused domain.
//   - The world is journaled under simcore.StatePrefix as one record per
//     domain ("lv/domain/<zone>/<name>") and per volume
//     ("lv/volume/<zone>/<pool>/<name>").
package libvirtsim
