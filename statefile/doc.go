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
//	P.mark          how far the journal is acknowledged, and the pinned keys
//	*.tmp           files being written; never read, removed by Open
//
// Every file but the mark starts with a 32-byte header carrying a magic
// string, the format version (journals 2, snapshots 3; see "Format
// versions" below), the file kind and a
// generation number, protected by a CRC32C. After the header come frames: a little-endian payload length, the
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
//     time and in Commit order, on a goroutine of the store's own (File:
//     right after the mark records the frame holding the batch, handed off
//     so the next fsync never waits for the callers). It gets nil once the
//     batch is durable and an error once it is not known to be; after one
//     error every later batch gets the same error (ErrClosed once Close
//     began). Once Wait(ctx, seq) returns nil, the Apply call that
//     returned seq and every earlier call are durable.
//   - A Commit without a callback (the simulator's world) is written
//     lazily: with the next frame someone waits for (a callback, Apply,
//     Wait or Close), or 20 ms after it was queued, whichever comes first.
//     Since durable order is call order, a record someone waited for
//     implies every earlier record is durable too.
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
//   - A writer whose journal or snapshot is removed or replaced under it
//     (rm of the whole state lets a second writer in) stops with ErrLost:
//     every commit checks, before it is acknowledged, that its journal is
//     still the file a later Open reads, and an idle writer checks every
//     500 ms; Stopped is closed then. Removing only P.lock stops nothing.
//   - Open fails, naming the directory, unless it can create, write, fsync
//     and remove a file next to the state.
//   - Nothing acknowledged is dropped silently. Before any record of a
//     group commit is acknowledged, P.mark records the journal's
//     generation, the length it is acknowledged up to, the checksum of the
//     frame that ends there, the number of records up to there and the
//     newest values of the pinned keys (Options.Pinned), with a second
//     fdatasync. The marker goroutine writes it while the committer
//     writes and fsyncs the next frame, and one mark write covers every
//     frame fsynced meanwhile, so the second sync costs latency (one
//     acknowledgement waits for both), not throughput. Only a torn tail — a last frame of the newest journal
//     beyond what the mark records, which was never acknowledged — is
//     dropped on recovery, and Open truncates it away. Any damage to what
//     the mark records (a flipped bit or zeroed range in the last frame as
//     anywhere else, a journal cut at a frame boundary or a missing
//     journal), and any other damage, fails Open and ReadOnly with a
//     *CorruptError naming the file and offset. That includes bad headers,
//     unknown versions, checksum mismatches or garbage before the tail,
//     and every broken promise one file makes about another: a missing
//     snapshot next to a journal with records; a missing journal of the
//     snapshot's generation, or one shorter than the snapshot's meta frame
//     records (which covers a journal truncated to its header, since the
//     start frame is always durable); a sealed journal whose successor is
//     missing; records in the successor while its predecessor is unsealed
//     or torn; a missing or unreadable mark where the snapshot promises
//     one. A state of the previous release has no mark: there, a complete
//     final frame that fails its checksum is damage too (nothing says it
//     was never acknowledged), and Open creates the mark and compacts.
//   - Options.Recover is the explicit way past damage whose *CorruptError
//     is Recoverable (to records, not to the snapshot or the structure):
//     Open rebuilds the state from everything before the first damage as
//     a new generation (journal, mark, snapshot, rename, as an upgrade
//     does), restores the pinned keys from the mark so that counters kept
//     there never regress, stores the report under Options.LossKey, logs
//     exactly what was dropped (file, offset, bytes, the records and keys
//     still readable there, the acknowledged records the mark counted) and
//     returns it from Recovered.
//   - A state the previous release wrote (format 1) loses nothing: ReadOnly
//     reads it as that release recovered it, and Open upgrades it to format
//     2 before accepting writes (see below).
//   - After a write or fsync fails, or a Commit exceeds the 256 MiB record
//     limit, the File stops: Healthy, every later callback and every Wait
//     for a record not durable by then return that error, because after a
//     failed fsync nothing about the page cache can be trusted, and later
//     records may depend on a refused one. A frame appended and fsynced
//     before the failure is still recorded in the mark and acknowledged:
//     Open replays it, so refusing it would call a record "not applied"
//     that a restart applies. The one exception is a failure of the mark
//     write itself (or of the file check after it): then nothing more is
//     acknowledged, and the frames it could not record are refused,
//     although Open still replays them (a known gap; the mark file is
//     written in place over allocated blocks, so a full disk does not
//     cause it on file systems that overwrite in place).
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
// The mark file is two 32 KiB slots written alternately in place (a torn
// write leaves the older, which records less), each with its own
// checksum and a sequence number; the newer whole slot counts.
//
// Format versions. A version-3 snapshot is a version-2 snapshot that
// promises a mark file; version 2 (the previous release) promises none.
// Version 1, written by the release before, has the
// same header and frame encoding but no start, seal or meta frames: a
// snapshot holds only entry frames and promises nothing about its journal,
// a journal holds only record frames, and a compaction leaves no seal. It
// is read by that release's rules: journals older than the snapshot are
// stale, the others are of its generation and at most the next, only the
// last journal replayed may end in a torn frame (dropped), a snapshot
// without a journal is the whole state, and everything else is a
// *CorruptError. No code writes version 1; any other version is refused.
//
// Upgrade. Open on a version-1 state recovers it, then installs it as a
// new generation N, one above every generation on disk, before accepting
// writes:
//
//  1. P.journal.next is replaced by an empty journal of N (written as in
//     compaction step 1, without a seal), unless P.journal.next is part of
//     the version-1 state (a compaction that release left unfinished); then
//     this step follows step 2;
//  2. the recovered state is written as snapshot N, recording the empty
//     journal's length, and renamed over P.snap;
//  3. P.journal.next is renamed over P.journal; every version-1 file is
//     then gone. Open logs "state upgraded" at Info once.
//
// Each step renames a complete, fsynced file over one that the state no
// longer needs, so a crash leaves one of these, each read whole (and finished by the next Open):
// the version-1 state, possibly with an empty version-2 P.journal.next of
// a generation above all of its own, which is ignored; snapshot N with only
// version-1 journals, P.journal.next among them, which is the whole state;
// snapshot N, a version-1 P.journal and the empty journal N at
// P.journal.next; or, when no version-1 journal existed, snapshot N and its
// empty journal at P.journal.next, which is a compaction before step 3 (and
// finishing it logs no upgrade). Any other mix of versions, or a version-2
// snapshot beside version-1 journals that records a non-empty journal or is
// not newer than them, is a *CorruptError.
//
// ReadOnly reads the same files without the lock while a writer runs. It
// opens all of them, replays, and then checks that every path still names
// the file it opened; files only ever move forward (tmp to snapshot, next to
// journal, then gone), so an unchanged set is a consistent cut, and a changed
// one is read again. It takes the next journal's length before the
// journal's, so a record seen in the former implies the seal is seen in the
// latter.
package statefile
