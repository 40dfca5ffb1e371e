// Package e2e is the black-box end-to-end suite for the provider binary: it
// builds cmd/provider once and runs it as a subprocess on the built-in
// simulators (libvirt-shaped and Proxmox-shaped) on free loopback ports.
// TestContract runs the hypervisor-neutral contract suite
// (internal/providertest/contract: /work/shared/contract/behavior.md over
// real gRPC, across kill -9 and SIGTERM restarts and fault modes) once per
// simulator, the two in parallel; the other tests here are about one
// provider's listeners, limits, CLI, state store and demo, or compare the
// hypervisors where they differ (bare metal, the backend choice).
//
// Invariants the tests rely on: every provider is started with
// --use-fake-backend and its own state directory; no test asserts on
// elapsed time except as a lower bound set by a configured timeout; async
// state is awaited by polling with a generous deadline. Benchmarks
// (bench_test.go) share one 100,000-machine provider and run only with
// -bench.
package e2e
