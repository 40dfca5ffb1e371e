// Package statefile durably stores the provider's desired document as a
// crash-safe key/value journal: callers Commit atomic batches of puts and
// deletes and are called back once each is on disk (or Apply them and Wait),
// and Load the recovered key/value map after a restart.
//
// A state at path P (a file path: Open and ReadOnly refuse a directory or a
// path ending in a separator) lives in these files, all mode 0600 in a
// directory created 0700 if missing:
//
//	P.lock          exclusive flock(2) lock held by the one writer
//	P.snap          snapshot: every key/value pair at the start of a generation
//	P.journal       append-only journal of changes on top of the snapshot
//	P.journal.next  the journal a running compaction is switching to
//	*.tmp           files being written; never read, removed by Open
//
// Every file starts with a 32-byte header carrying a magic string, the
// format version (2), the file kind and a generation number, protected by a
// CRC32C. After the header come frames: a little-endian payload length, the
// CRC32C of the payload and a CRC32C of those eight bytes, then the payload.
// A snapshot's first frame is its meta frame, recording how many bytes of
// its generation's journal were durable when it was installed; its other
// frames hold runs of key/value entries. A journal's first frame is a start
// frame naming its generation; each later frame holds one group commit (one
// or more records, one per Commit or Apply call), except that a journal a
// compaction left ends with a seal frame naming the next generation.
//
// Invariants callers may rely on:
//
//   - Commit's callback runs exactly once, never inside Commit, one at a
//     time and in Commit order (File: on its committer goroutine, right
//     after the fsync of the frame holding the batch; Memory: on a goroutine
//     of its own). It gets nil once the batch is durable and an error once it
//     is not known to be; after one error every later batch gets the same
//     error (ErrClosed once Close began). Once Wait(ctx, seq) returns nil,
//     the Apply call that returned seq and every earlier call are durable.
//     Durable means it survives kill -9 and power loss at any instant (given
//     a file system that honours fsync).
//   - The ops of one Commit or Apply call are replayed all together or not
//     at all, and durable order is call order.
//   - The durable cost of a mutation does not depend on the size of the
//     state: a group commit appends one frame and issues one fsync, covering
//     every record queued while the previous fsync ran. Compaction runs in
//     the background and never stops Commit or Apply.
//   - At most one process writes a state. Open fails fast with ErrLocked
//     when another holder has P.lock, and also when another holder has one
//     of the journals: a writer keeps a flock on every journal it may
//     append to (the next one from before it is renamed into place, the
//     sealed one until it is replaced), so deleting P.lock lets no second
//     writer in. (Only removing P.lock during the milliseconds another
//     Open takes to create a brand-new state is not covered.)
//   - Open fails, naming the directory, unless it can create, write, fsync
//     and remove a file next to the state.
//   - Only a torn tail — a partially written last frame of the newest
//     journal, which was never acknowledged — is dropped on recovery, and
//     Open truncates it away. Any other damage fails Open and ReadOnly with
//     a *CorruptError naming the file and offset; data is never silently
//     skipped. That includes bad headers, unknown versions, checksum
//     mismatches or garbage before the tail, and every broken promise one
//     file makes about another: a missing snapshot next to a journal with
//     records; a missing journal of the snapshot's generation, or one
//     shorter than the snapshot's meta frame records (which covers a journal
//     truncated to its header, since the start frame is always durable); a
//     sealed journal whose successor is missing; records in the successor
//     while its predecessor is unsealed or torn. A journal cut exactly at a
//     frame boundary past the length the snapshot records cannot be told
//     from a crash before those frames and is not detected.
//   - After a write or fsync fails, or a Commit exceeds the 256 MiB record
//     limit, the File stops: Healthy, every Wait and every later callback
//     return that error, because after a failed fsync nothing about the page
//     cache can be trusted, and later records may depend on a refused one.
//     I/O errors name the file as it is called now.
//
// Compaction protocol (generation G to G+1), run when the journal outgrows
// Options.CompactBytes:
//
//  1. between two group commits, the committer clones the in-memory map,
//     which then equals snapshot G plus all of P.journal, creates
//     P.journal.next with header and start frame G+1 (written as a locked
//     .tmp file, fsynced, renamed, directory fsynced), then appends and
//     fsyncs the seal frame of P.journal, and only then appends to the new
//     journal;
//  2. a background goroutine writes the clone to P.snap.tmp with header G+1
//     and a meta frame recording the new journal's durable length, fsyncs
//     it, renames it over P.snap and fsyncs the directory;
//  3. it renames P.journal.next over P.journal and fsyncs the directory.
//
// A new state is created journal first (generation 1, start frame only),
// then snapshot; an empty journal of generation 1 alone is therefore no
// state yet.
//
// Recovery reads P.snap (generation S), ignores journals older than S as
// stale and replays the journal of generation S followed by that of S+1 if
// present, so a crash between any two of those steps recovers every
// acknowledged record. Open then finishes an interrupted compaction before
// accepting writes: with two journals it installs the snapshot of step 2
// from the state at the end of the first, then renames as in step 3.
//
// ReadOnly reads the same files without the lock while a writer runs. It
// opens all of them, replays, and then checks that every path still names
// the file it opened; files only ever move forward (tmp to snapshot, next to
// journal, then gone), so an unchanged set is a consistent cut, and a changed
// one is read again. It takes the next journal's length before the
// journal's, so a record seen in the former implies the seal is seen in the
// latter.
package statefile
