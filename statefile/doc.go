// Package statefile durably stores the provider's desired document as a
// crash-safe key/value journal: callers Apply atomic groups of puts and
// deletes, Wait until they are on disk, and get the recovered key/value map
// back from Open after a restart.
//
// A state at path P lives in these files, all mode 0600 in a directory
// created 0700 if missing:
//
//	P.lock          exclusive flock(2) lock held by the one writer
//	P.snap          snapshot: every key/value pair at the start of a generation
//	P.journal       append-only journal of changes on top of the snapshot
//	P.journal.next  the journal a running compaction is switching to
//	*.tmp           files being written; never read, removed by Open
//
// Every file starts with a 32-byte header carrying a magic string, the
// format version, the file kind and a generation number, protected by a
// CRC32C. After the header come frames: a little-endian payload length, the
// CRC32C of the payload and a CRC32C of those eight bytes, then the payload.
// A journal frame holds one group commit (one or more Apply records); a
// snapshot frame holds a run of key/value entries.
//
// Invariants callers may rely on:
//
//   - Once Wait(ctx, seq) returns nil, the Apply call that returned seq and
//     every earlier Apply call survive kill -9 and power loss at any instant
//     (given a file system that honours fsync).
//   - The ops of one Apply call are replayed all together or not at all, and
//     durable order is Apply call order.
//   - The durable cost of a mutation does not depend on the size of the
//     state: a group commit appends one frame and issues one fsync, covering
//     every record queued while the previous fsync ran. Compaction runs in
//     the background and never stops Apply.
//   - At most one process writes a state: Open fails fast with ErrLocked
//     when another holder has the lock.
//   - Only a torn tail — a partially written last frame of the newest
//     journal, which was never acknowledged — is dropped on recovery, and Open
//     truncates it away. Any other damage (bad header, unknown version, a
//     checksum mismatch or garbage before the tail, a missing snapshot) fails
//     Open and ReadOnly with a *CorruptError naming the file and offset; data
//     is never silently skipped.
//   - After a write or fsync fails, the File stops: Healthy and every Wait
//     return that error, because after a failed fsync nothing about the page
//     cache can be trusted.
//
// Compaction protocol (generation G to G+1), run when the journal outgrows
// Options.CompactBytes:
//
//  1. between two group commits, the committer clones the in-memory map,
//     which then equals snapshot G plus all of P.journal, and switches to a
//     fresh P.journal.next whose header says G+1 (written as a .tmp file,
//     fsynced, renamed, directory fsynced);
//  2. a background goroutine writes the clone to P.snap.tmp with header G+1,
//     fsyncs it, renames it over P.snap and fsyncs the directory;
//  3. it renames P.journal.next over P.journal and fsyncs the directory.
//
// Recovery reads P.snap (generation S), ignores journals older than S as
// stale and replays the journal of generation S followed by that of S+1 if
// present, so a crash between any two of those steps recovers every
// acknowledged record. Open then finishes or redoes an interrupted
// compaction before accepting writes.
//
// ReadOnly reads the same files without the lock while a writer runs. It
// opens all of them, replays, and then checks that every path still names
// the file it opened; files only ever move forward (tmp to snapshot, next to
// journal, then gone), so an unchanged set is a consistent cut, and a changed
// one is read again.
package statefile
