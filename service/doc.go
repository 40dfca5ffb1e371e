// Package service serves the bigfleet.v1alpha1.CapacityProvider gRPC API on
// top of the desired document. Handlers validate, fence, resolve
// idempotency and record intent through desired.Document.Mutate; they never
// call a hypervisor and never wait for one.
//
// Error codes (documented for the shard in docs/operations.md):
// InvalidArgument for malformed requests (including invalid UTF-8 in any
// string field) and caps, FailedPrecondition only for fencing, NotFound
// for an unknown id, Aborted for a mutation out of position, a conflicting
// retry or a mutation on a FAILED machine, Unimplemented for Delete on a
// bare_metal pool, ResourceExhausted when a fence budget is full,
// Unavailable when the state store cannot commit.
//
// Invariants:
//   - Every message a handler returns is a complete, correct message: an
//     interceptor or in-process caller sees exactly what the wire carries.
//   - A machine's wire message is built once per immutable machine value
//     and shared; nothing may modify a returned message.
package service
