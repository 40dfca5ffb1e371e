// Package planner computes plans: from the desired document, an observed
// snapshot and configuration, the ordered ensure-steps that converge the
// hypervisors on what BigFleet asked for, plus the drift it found.
//
// Invariants:
//   - Planning is pure and deterministic: no I/O, no clock (time is an
//     argument), sorted output. The same inputs give the same plan.
//   - Nothing is created or destroyed in a zone that is not observed OK.
//   - Destructive steps target only VMs carrying this installation's marker.
//   - The bootstrap blob is never part of a plan.
//   - These types are not a wire format (they carry no JSON tags): the
//     published form is jsonplan.Plan, reached only through Plan.JSON,
//     which copies each field explicitly.
//   - What an action is (its effect, whether it is destructive, needs an
//     owner check or loads the host) is a property of the action
//     (hypervisors.ActionInfo: CoreActions, or the plug-in's Actions,
//     checked once by CheckPlugin), never derived from its rendering.
//   - Planning one machine is O(1) index lookups (Machine); a full plan is
//     linear in the fleet (Build).
package planner
