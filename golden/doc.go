// Package golden pins the planner's output for named situations: one
// txtar file per situation, holding the configuration, the desired
// document, the observed world and the expected human and JSON plans.
// Run is the runner; it knows no hypervisor: a Setup gives it one (its
// planner plug-in and a simulated World). The libvirt and Proxmox cases
// live in testdata/ (golden_test.go); a plug-in package runs cases of its
// own testdata with its own Setup. `go test ./golden -update` rewrites the expected sections after
// an intended planner change; CI never passes -update, so a plan that
// would change fails the test.
//
// Invariants the runner checks for every case:
//   - The plan is a deterministic function of the case: building it twice
//     gives the same bytes, and the JSON round-trips unchanged.
//   - The human plan is rendered from the JSON plan, and the JSON plan
//     validates against the published schema (docs/plan.schema.json).
//   - No bootstrap blob of any machine appears in either plan.
//   - Applying the plan to the simulator (executor plus the reconciler's
//     outcome rules), re-observing and re-planning converges to an empty
//     plan, unless the case says `expect-converged: false` with a reason,
//     in which case the final plan must still be non-empty (so the mark
//     cannot go stale).
//   - After convergence, every IDLE or CONFIGURED machine's host
//     reference names an owned VM that exists.
package golden
