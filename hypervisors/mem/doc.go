// Package mem is a third, minimal hypervisor that exists only in its
// tests: the proof that a hypervisor is a plug-in. It follows
// docs/architecture.md#adding-a-hypervisor step by step and touches no
// other package: its vocabulary (two steps), its planner and its plug-in
// are in mem_test.go, its runtime in runtime_test.go, and its tests run
// the golden runner (testdata/) and the black-box contract suite
// (internal/providertest/contract) against a provider binary whose
// registry holds only mem.
//
// Its runtime is its own in-memory world, built on the hypervisor-neutral
// simulator core (hypervisors/simcore) and nothing of another
// hypervisor's room (TestImportsNoOtherRoom checks it, tests included).
// It differs from libvirt where a real third hypervisor could:
//   - identity by id (planner.ByID): a create allocates a numeric id,
//     Apply returns it, the executor carries it to the steps that follow,
//     and every call finds a VM by zone and id, never by name (two VMs
//     may share a name);
//   - the ownership marker is a field of the VM's record, checked with
//     simcore.CheckMarker when written and read back as is by Observe;
//   - the world is journaled as one record per VM ("mem/vm/<id>" under
//     simcore.StatePrefix) and reopened from the provider's state;
//   - its own guest transport: the at-most-once protocol of package guest
//     runs over mem's agent channel, which carries at most maxWrite bytes
//     per message (so the bootstrap blob goes in parts), in front of
//     simcore's wire (simcore.Core.Wire) and its simulated guest
//     (TestAgentGoesOverMemsTransport).
package mem
