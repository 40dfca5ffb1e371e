// Package providertest runs the provider binary for the black-box suites
// (e2e, acceptance/libvirt, acceptance/proxmox): it builds the binary once
// per test package, starts it on fresh loopback ports, waits for /readyz,
// dials gRPC, and kills, restarts, terminates, pauses and resumes it. It
// is imported by tests only.
//
// Invariants:
//   - Every process it starts is reaped before the test that started it
//     ends (t.Cleanup), unless the caller asked for a detached Provider and
//     kills it itself.
//   - Every process exit it observes is checked for a race detector report
//     (NoRace), once per process, on the test's goroutine.
//   - A Provider's output is one stream across its launches, each launch
//     preceded by a "===== launch" header; Output is the current launch's
//     part, Log the whole stream.
//   - A Provider's Client and Conn stay valid across Restart and Launch:
//     they always reach the current process.
package providertest
