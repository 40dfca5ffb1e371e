// Package etcdstore keeps the provider's desired document in an etcd
// cluster and elects the one replica that may write it: a Store with the
// same Load/Commit/Healthy contract as the local journal, an Elector whose
// Term fences every write, and the --state etcd://... URL and client
// (TLS, client certificates) that reach the cluster.
//
// # Layout
//
// Under a prefix P (from etcd://HOST:PORT[,HOST:PORT...]/P):
//
//	P/election/<lease>  one key per campaigning replica, bound to its
//	                    session lease; the oldest is the leader and its
//	                    value is the leader's identity
//	P/state/<key>       the document's key/value pairs (Op.Key)
//	P/writer            "<lease>/<n>" of the last txn a leader wrote
//
// # Invariants
//
//   - One leader. A Term exists only while its election key, created by
//     this replica's lease, is the oldest under P/election. Every txn the
//     Store sends carries Term.Guard (that key still has the term's create
//     revision), so once the lease expires or is revoked (the key goes
//     with it) no write of the old term can apply, however late it
//     arrives: a paused or partitioned leader is fenced by etcd itself.
//   - Stop before the lease runs out. The term renews its lease every
//     TTL/6 and ends locally at (send time of the newest acknowledged
//     renewal + TTL - Margin), which is before the cluster can expire the
//     lease, so a leader that cannot renew stops its executor before any
//     other replica can win. Term.Err checks that deadline on each call,
//     so a process resumed after SIGSTOP learns it lost before its timers
//     even run. Done also closes when the election key is deleted
//     (watch) or the session ends; the lease is then revoked so a standby
//     takes over without waiting for the TTL.
//   - Committed before acknowledged. A batch's done(nil) runs only after
//     etcd committed the txn holding its last op. done runs exactly once
//     per Commit, in Commit order, from one goroutine. The first failed txn
//     stops the store for good (Healthy returns its error and every later
//     batch fails) and ends the term: the replica steps down, its lease is
//     revoked (fencing anything still in flight), and the next leader
//     reloads from etcd, which is the truth.
//   - Group commit. The committer takes everything queued and writes it in
//     as few txns as etcd's limits allow (Options.MaxTxnOps,
//     MaxRequestBytes; one op and a reserve per txn are the store's own),
//     one txn in flight at a time. Ops of one txn touch distinct keys; of
//     several ops on one key (within or across batches) the last wins,
//     which is what applying them in order would leave. A queue holding
//     only background batches (CommitBackground: the reconciler's records,
//     no RPC waits on them) is held for the last txn's duration, at most
//     Options.Linger (10 ms), until a Commit joins it, so a lone client's
//     next mutation shares the txn of the reconciler's records of its
//     previous one instead of waiting a whole txn behind it; a Commit that
//     arrives within the hold is acknowledged no later than it would have
//     been behind the background txn. The order of the queue, what a txn
//     guards and when done runs relative to etcd's commit do not change.
//   - Atomicity per batch, except oversized ones. A batch that fits one
//     txn applies all together or not at all. Only a batch larger than one
//     txn (the first write of a whole fleet) is split: all but its last
//     chunk are written Options.ChunkParallel txns at a time, and the last
//     goes with the next regular txn. If one of them fails, those applied
//     stay and the store fails, so such a batch must be one the document
//     can reload partially (puts of independent keys).
//   - Retries apply at most once. A txn that fails with Unavailable or
//     Unknown (a member down, an etcd leader change, a server timeout) or
//     whose attempt outlives Options.AttemptTimeout (2 s) is sent again
//     until Options.TxnTimeout (5 s by default; a cluster without quorum
//     therefore fails the store within that time, or sooner when the term
//     ends). Every regular txn also compares the mod revision of P/writer
//     with the one the last txn left and rewrites it, so a retry or a
//     delayed earlier attempt can apply only once and never after a later
//     txn; a retry that finds its own writer value reports success. Chunk
//     txns compare that revision without moving it: they touch distinct
//     keys, so applying one twice changes nothing, and none can land after
//     the txn that follows them.
//   - Consistent load. Load reads P/state/ in pages (Options.LoadPageSize)
//     at the revision of its first page, which is read in a txn guarded by
//     the term; it restarts if compaction overtakes that revision.
//   - Warm load. With Options.Warm, Open claims P/writer (a put guarded
//     by the term and by the writer key's revision it read) and Load
//     takes a standby's copy (Follower.Take) once the claim's event has
//     reached it: every earlier term's writes were guarded by an election
//     key deleted before this term began, and the watch delivers events
//     in order, so the copy equals what a guarded read would return. No
//     progress report is trusted for it (etcd before 3.4.25 and 3.5.8 may
//     send one ahead of events still to come, etcd issue 15220). A copy
//     that does not get there within Options.WarmWait is dropped and Load
//     reads etcd.
//
// # Standbys
//
// Every replica given the same prefix runs an Elector with its own
// identity. Campaign blocks while another replica leads; meanwhile
// Elector.Leader (one read) or Elector.Observe (a watch) name the leader
// for UNAVAILABLE answers. When the Term's Done closes, the holder stops
// its executor and reconcile loop, closes its Store and campaigns again.
//
// A Follower keeps a standby's one copy of P/state/: a consistent load,
// then a watch of all of P/ from the next revision (on a gRPC stream of
// its own that requires an etcd leader), every event of P/state/ applied
// as it comes; a watch compacted past, cancelled or closed means a fresh
// load. Its revision moves with every event under P/ (the writer key's
// too) and never with a progress report, and Take waits until it reaches
// the revision asked.
//
// # Operating etcd
//
// etcd keeps every revision until it is compacted, and this store rewrites
// P/writer with every txn, so the cluster must compact its history itself:
// run etcd with --auto-compaction-mode=periodic
// --auto-compaction-retention=1h (or revision mode), and defragment now
// and then; otherwise the database grows until it hits
// --quota-backend-bytes and etcd refuses all writes. The tests run members
// with a 10 s periodic retention. The store's limits must match the
// cluster's --max-txn-ops and --max-request-bytes (defaults 128 and
// 1.5 MiB).
package etcdstore
