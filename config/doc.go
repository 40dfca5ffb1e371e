// Package config turns the provider's command-line flags into one
// validated Config: which hypervisor and backend to drive, the zones, the
// instance-type catalog, the offerings and the slots they mint, prices,
// listeners, TLS material, timeouts and logging.
//
// The hypervisors' own flags belong to their plug-ins (package plugin):
// config registers every plug-in of the registry it is given, picks one
// (--hypervisor, else the plug-in whose flags are set, else the
// registry's default) and lets it resolve its flags; Config.Plugin is the
// result. config never asks which hypervisor it serves.
//
// Invariants callers rely on:
//   - Resolve validates everything before anything listens or dials, and
//     reports every problem at once, one per line, each naming its flag.
//   - A Config returned without error is complete: per-hypervisor defaults
//     are applied, files named by flags (catalog, offerings, token, CA,
//     base user data, TLS keypair) have been read and checked, and
//     Offerings, Slots and Zones agree with each other.
//   - A credential (the Proxmox token secret) is a Secret: it formats,
//     marshals and logs as "[redacted]", and no error produced here
//     contains it.
//   - A flag that belongs to another hypervisor is an error, never
//     silently ignored.
package config
