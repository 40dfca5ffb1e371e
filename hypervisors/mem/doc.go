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
//     simcore.StatePrefix) and reopened from the provider's state.
//
// The guest is simcore's simulated guest, reached through the core's
// agent methods: the at-most-once protocol of package guest runs over the
// core's own agent wire, as in the two other simulators. simcore exports
// no guest.Transport a simulator could put its own wire in front of, so
// mem has no transport of its own yet.
package mem
