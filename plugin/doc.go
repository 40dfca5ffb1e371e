// Package plugin is the root contract between the core and the
// hypervisors: what one hypervisor package registers (its flags, their
// validation and resolution, its catalog and capacity rules, the
// certificates it presents, its planner, and how its adapter and its
// simulator are opened) and the Registry the composition root builds
// from them.
//
// Invariants:
//   - There is no global registry and no registration by init():
//     cmd/provider builds one Registry (NewRegistry or MustRegistry) and
//     passes it down; tests build their own.
//   - The first plug-in of a Registry is the default hypervisor; the
//     order is also the order of the usage groups.
//   - A Registry refuses duplicate names and a flag two plug-ins both
//     define, so setting a plug-in's flag selects that plug-in
//     unambiguously (a plug-in flag that is also a core flag panics when
//     config registers both on one FlagSet, at the first start).
//   - The core (config, server, cli code) asks a Resolved plug-in, never
//     which hypervisor it is.
package plugin
