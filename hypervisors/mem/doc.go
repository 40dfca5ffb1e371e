// Package mem is a third, minimal hypervisor that exists only in its
// tests: the proof that a hypervisor is a plug-in. It follows
// docs/architecture.md#adding-a-hypervisor step by step and touches no
// other package: its vocabulary (two steps), its planner, its runtime and
// its plug-in are in mem_test.go, and its tests run the golden runner
// (testdata/) and the black-box contract suite
// (internal/providertest/contract) against a provider binary whose
// registry holds only mem.
//
// Its VMs live in memory. The runtime reuses the libvirt-shaped
// simulator of hypervisors/libvirt/libvirtsim as its substrate (power, the simulated
// guest and its agent, journaling into the provider's state), reached
// only through that simulator's exported API: mem's own steps decide
// what a create and a destroy are.
package mem
