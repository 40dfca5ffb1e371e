// Package providertest is the black-box suites' one toolkit (e2e,
// acceptance/libvirt, acceptance/proxmox, acceptance/ha, acceptance/soak,
// and metrics' in-process tests). It runs the provider binary: builds it
// once per test package, starts it on fresh loopback ports, waits for
// /readyz, dials gRPC, and kills, restarts, terminates, pauses and
// resumes it, with extra environment variables when the binary is a test
// binary (Options.Env, RunEnv). It speaks to it: the machine states
// (StIdle ...), Get, ListAll, WaitState and WaitFor (bounded; FAILED is
// fatal unless wanted), Must for acks, the four mutations with a fencing
// Token, Speculative, ToIdle, ToConfigured, WaitSettled, Holds, the wire
// schema's field-shape rules (ShapeProblems, CheckShape) and RawCodec
// for requests the protobuf runtime refuses to marshal (wire.go); it
// reads its metrics: Metric over a /metrics body or a running Provider,
// WaitMetric (metrics.go); and it drives the simulator's admin endpoints
// (Provider.Admin). A suite that needs one of these uses it rather than
// its own copy. Subpackage contract is the black-box contract suite that
// runs on any hypervisor. It is imported by tests only.
//
// Invariants:
//   - Every wait is bounded by the max its caller gives, and fails the
//     test when it passes.
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
