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
//   - No switch on the kind: no non-test file of a core package holds a
//     string literal that is a hypervisor's name in any case (the names
//     the implementations register, found in their plugin.Info literals,
//     plus libvirt, proxmox and mem): as an operand, a case, a map key or
//     value, a constant, a variable or a call's argument it can only pick
//     one hypervisor. Comments, flag help and messages may mention them
//     (longer strings); the one exception is a versioned format's own
//     vocabulary (jsonplan.Hypervisors11), listed with why. Nor does it
//     compare or switch on a selector named Hypervisor or Shape, on the
//     Name of a plug-in (plugin.Info.Name, planner.Plugin.Name()), or on
//     a variable assigned from one. Looking a plug-in up by its name in a
//     registry is dispatch, not a branch, and is allowed.
//   - Rooms: every directory under hypervisors/ but guest and simcore is
//     a hypervisor's room (libvirt, proxmox, mem; a new one is a room the
//     moment it exists). No package of a room depends, directly or
//     through others, on a package of another room, and nothing under
//     hypervisors/simcore (the simulators' shared core) depends on any
//     room; a package's tests count as the package.
//   - Shared simulator settings: every field of simcore.Options is read by
//     simcore itself; a setting only a room reads (a libvirt pool, a
//     Proxmox template) belongs in that room's simulator Options, which
//     embed simcore's.
//
// Every violation is reported at once, sorted, as file:line: what.
package layout
