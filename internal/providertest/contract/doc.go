// Package contract is the black-box contract suite of a CapacityProvider
// on a hypervisor's simulator: Run(t, Harness) runs, against one
// hypervisor, every test that speaks only the wire (gRPC), /metrics,
// /debug/plan, the simulator's /admin endpoints and the binary's own
// subcommands (plan, history): the lifecycle trace and field shapes,
// error codes, idempotent and parallel retries, list filters, paging and
// the revision cursor, Configure's caps and verbatim shard metadata,
// fencing, the conformance fault convention, kill -9 and SIGTERM
// restarts, a guest command never running twice, a graceful stop, startup
// validation, offerings shrinking, plans and drift, and a machine's
// history. e2e runs it for libvirt and Proxmox; a new hypervisor runs it
// from its own package, with no edit here.
//
// Invariants the tests rely on and keep:
//   - A test asks nothing of the hypervisor but what the Harness says: its
//     flags (Args), its instance types' prefix (TypePrefix, for offerings
//     files, in a zone of the suite's own) and the plan actions that create
//     a VM (CreateActions: VM creations are counted on
//     bigfleet_provider_executor_steps_total{action,outcome="ok"}, never on
//     a hypervisor's own operation labels). Zones are read from the
//     machines.
//   - Every provider runs on the simulator (Args carry --use-fake-backend
//     or its equivalent), on free loopback ports and its own state
//     directory, and is killed when its test ends.
//   - No test asserts on elapsed time except as a lower bound set by a
//     configured timeout; asynchronous state is awaited by polling with a
//     bound (providertest.SettleDeadline).
//   - Run runs the tests one after the other: a caller that runs several
//     hypervisors runs them in parallel, so a machine runs one provider
//     per hypervisor at a time.
package contract
