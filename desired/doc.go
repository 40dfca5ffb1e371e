// Package desired holds the desired document: every machine slot, the
// intent it is in, operation ids, fence marks, cluster bindings and the
// List revision space. gRPC handlers only mutate it; the reconciler reads it
// and reports outcomes back.
//
// Invariants:
//   - A mutation is acknowledged only after it is durable in the Store; a
//     retried mutation waits for the original's durability before it is
//     acknowledged with the same operation id.
//   - Machine values are immutable once published (copy on write), so
//     readers never lock beyond fetching a pointer.
//   - Operation ids come from a counter persisted atomically with the
//     change that used them: never reused, also across restarts.
//   - Revisions grow with every change; machines are kept in revision order
//     so a List delta costs O(changes).
//   - The bootstrap blob lives only in memory.
package desired
