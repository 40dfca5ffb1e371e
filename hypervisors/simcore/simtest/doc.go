// Package simtest is the test suite of the behaviour every simulator built
// on package simcore shares (the guest agent and its protocol, the
// conformance faults, latency, hooks, flapping calls, the journal and the
// host capacity). Each room's simulator runs it on itself with Run and a
// Shape that says how to open a simulator, create a VM through the
// interface and place one out of band; nothing here knows which
// hypervisor it tests.
//
// Every test opens its own simulators and closes them when it ends
// (t.Cleanup); none waits on a duration to assert an outcome beyond the
// bounded polls the original tests already made.
package simtest
