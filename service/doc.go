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
//   - The encoded List answers gRPC has not freed yet (a reader that does
//     not read holds them) are counted, and their bytes stay within the
//     larger of MinListBytes and ListBytesFullAnswers full answers; a List
//     past it answers ResourceExhausted. Full Lists of one document at one
//     revision share one encoding. An answer is counted until gRPC frees
//     its buffer, its message is dropped unsent, or ConnClosed reports its
//     connection gone.
package service
