// Package reconciler runs the level-based loop: it observes the
// hypervisors, plans, executes, and reports outcomes into the desired
// document. Intents wake it per machine; a periodic full pass finds drift.
//
// Invariants:
//   - Work is keyed by machine id in a rate-limited work queue with
//     controller-runtime's semantics (k8s.io/client-go/util/workqueue): one
//     entry per id, so its memory is bounded by the fleet; one machine is
//     reconciled by at most one worker at a time, and a machine changed
//     while being worked on is worked on again afterwards; a machine that
//     must wait or whose repair failed is retried with per-machine
//     exponential backoff, forgotten once it succeeds.
//   - Stopping drains: queued and in-flight work finishes (bounded by the
//     caller's grace, which cancels work), nothing new is taken on.
//   - A transition's work runs under its deadline; past it the machine is
//     FAILED with a readable last_error, and a late success is discarded
//     by desired.Complete.
//   - An unknown zone is never planned on; work there waits and retries.
//   - A drift repair ends: its run is bounded by RepairTimeout (and the
//     executor's attempts per step), then it goes back to the queue's
//     per-machine backoff and RepairFailures reports it.
//   - The published plan totals follow every machine's reconcile, are
//     replaced whole (never reset and rebuilt in place), and an older
//     observation never overwrites a newer one; reads (Plan, ObserveAll)
//     publish nothing.
package reconciler
