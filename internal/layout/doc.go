// Package layout holds the house rules of the repository as a test: the
// core never depends on a hypervisor implementation and never asks which
// hypervisor it serves, and one hypervisor's room never depends on
// another's. It has no code, only tests (layout_test.go, rooms_test.go):
//
//   - Imports: the production dependencies (go list -deps, transitive) of
//     every core package hold no package under hypervisors/ (the contract
//     package hypervisors itself is core). Every top-level package of the
//     module is classified as core, implementation (hypervisors/...),
//     composition root (cmd/provider) or test-only; an unclassified one
//     fails the test, so a new package is placed on one side on purpose.
//   - No switch on the kind: no non-test file of a core package compares,
//     switches on or keys a map literal with a hypervisor's name (the
//     names the implementations register, found in their plugin.Info
//     literals, plus libvirt, proxmox and mem), nor compares or switches
//     on a selector named Hypervisor or Shape, or on the Name of a
//     plug-in (plugin.Info.Name, planner.Plugin.Name()). Comments, flag
//     help and messages may name a hypervisor: only comparisons, switch
//     cases, map keys and constants count.
//   - Rooms: no package under one hypervisor's directory (rooms:
//     hypervisors/libvirt, hypervisors/proxmox) depends, directly or
//     through others, on a package of another room, and nothing under
//     hypervisors/simcore (the simulators' shared core) depends on any
//     room; a package's tests count as the package.
//
// Every violation is reported at once, sorted, as file:line: what.
package layout
