// Package desired holds the desired document: every machine slot, the
// intent it is in, operation ids, fence marks, cluster bindings and the
// List revision space. gRPC handlers only mutate it; the reconciler reads it
// and reports outcomes back. It also defines the Store contract its changes
// become durable through (the local journal, etcd, or memory).
//
// Invariants:
//   - Committed before visible: readers (Get, List, All, Counts, Pending,
//     Revision, Blob) see only changes the Store has committed, in commit
//     order. A change that fails to commit is never visible, and since a
//     Store that failed stays failed, the document then refuses every
//     further change (Unavailable) rather than build on a lost one.
//   - GetFresh (the Get RPC) waits, at most FreshWait and never past its
//     context, for a change to its machine that is in flight, then answers
//     the committed value. In flight is derived (working value not yet
//     the committed one), so nothing is recorded per change.
//   - A mutation is acknowledged only after it is committed; a retried
//     mutation waits for the original's commit before it is acknowledged
//     with the same operation id.
//   - Machine values are immutable once published (copy on write; the
//     revision order lives beside them, in revlog), so readers never lock
//     beyond fetching a pointer and may keep a value as long as they like.
//   - Operation ids come from a counter committed atomically with the
//     change that used them: never reused, also across restarts.
//   - Fencing compares (epoch, sequence) as plain int64 pairs per
//     unambiguous (shard_id, machine_id) key and runs before every other
//     check of the request except the ids that form the key. Marks are
//     bounded per machine, for unknown ids and in bytes; past a bound a new
//     first contact is refused (ResourceExhausted) and no mark is dropped.
//   - Every client input is capped (see limits.go) and echoed only clipped.
//   - Revisions grow with every change; List deltas cost O(changes), and a
//     paged walk from any start is set-complete under concurrent mutation.
//   - The bootstrap blob lives only in memory (a retry of the same
//     Configure hands it back to a replica that took over). Every
//     transition interrupted by a restart or fail-over is re-driven from
//     its durable intent; whether a guest command it started finished is
//     read from the guest's own record (package guest), never guessed.
package desired
