package statefile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofrs/flock"

	"github.com/bigfleet-vm/provider/kv"
)

// Op is one change: a put of Value under Key, or a delete of Key.
type Op = kv.Op

// Store is the journal's API: File implements it, and so does the
// in-memory model the tests hold File against.
type Store interface {
	// Snapshot returns a copy of the current state: the recovered state
	// plus every op applied since. Values must not be modified.
	Snapshot() map[string][]byte
	// Apply queues ops as one atomic record and returns its sequence
	// number. It never waits for the disk.
	Apply(ops ...Op) uint64
	// Wait returns nil once every record up to seq is durable.
	Wait(ctx context.Context, seq uint64) error
	// Load returns every committed key/value pair; call it once, before
	// the first Commit. Values must not be modified.
	Load(ctx context.Context) (map[string][]byte, error)
	// Commit queues ops as one atomic batch and returns without waiting.
	// done, if not nil, is called exactly once, never from inside Commit,
	// by the store, one call at a time and in Commit order: nil once the
	// batch is durable, or an error once it is not known to be. A store
	// that fails a batch fails every later batch too.
	Commit(ops []Op, done func(error))
	// Healthy returns the error that stopped the store, if any.
	Healthy() error
	// Size is the store's footprint in bytes, for metrics.
	Size() int64
	// Close flushes what is queued and releases the store.
	Close() error
}

var _ Store = (*File)(nil)

var (
	// ErrLocked is returned by Open when another holder has the state.
	ErrLocked = errors.New("state is locked by another process")
	// ErrClosed is returned for records that were never written because
	// the store was closed.
	ErrClosed = errors.New("state store is closed")
	// ErrLost stops a File whose files were removed or replaced under it
	// (rm of the state, a restore over it): whatever it wrote after that is
	// in no file a later Open reads, and the lock that kept other writers
	// out may be gone, so it must not write, or act, any more.
	ErrLost = errors.New("the state's files were removed or replaced under the running writer")
)

// DefaultCompactBytes is the smallest journal size that triggers a
// compaction when Options.CompactBytes is zero.
const DefaultCompactBytes = 64 << 20

// Options tune a File. The zero value is production-ready.
type Options struct {
	// Logger receives recovery and compaction events; nil discards them.
	Logger *slog.Logger
	// CompactBytes is the journal size that starts a background
	// compaction. Zero means the larger of DefaultCompactBytes and twice
	// the snapshot; negative disables automatic compaction.
	CompactBytes int64
	// OnCommit, if set, is called after every group commit with the number
	// of records and bytes it made durable and how long that took (the
	// journal's fsync and the mark's fdatasync). It runs on the marker
	// goroutine, after the commit's callbacks were handed off, and must
	// return quickly: later acknowledgements wait for it.
	OnCommit func(records int, bytes int, fsync time.Duration)
	// NoSync skips every fsync. Only for tests: a crash loses data.
	NoSync bool
	// Recover lets Open get past damage to acknowledged records: a journal
	// frame that fails its checksum within what the mark records as
	// acknowledged (or, without a mark, a complete final frame that does),
	// a journal cut short of the mark, a missing journal or mark. Open then
	// rebuilds the state from what precedes the first damage as a new
	// generation, restores the pinned keys from the mark, stores a report
	// under LossKey and logs exactly what was dropped (Recovered returns
	// it). Without Recover such damage fails Open with a *CorruptError
	// whose Recoverable is set. Damage to the snapshot is never recovered.
	Recover bool
	// Pinned selects the keys whose newest acknowledged value is also kept
	// in the mark, so that it survives the loss of the journal's tail
	// (counters that must never regress). Their values together are at
	// most MaxPinnedBytes.
	Pinned func(key string) bool
	// LossKey, if set, is where a recovery that dropped records stores its
	// report (JSON), so the state's owner learns of the loss even after a
	// crash right after the recovery.
	LossKey string
}

// File is a durable Store backed by the files described in doc.go.
type File struct {
	p    paths
	opts Options
	log  *slog.Logger
	lock *flock.Flock

	mu           sync.Mutex
	wake         *sync.Cond // the committer waits on it for work
	state        map[string][]byte
	queue        []*batch // oldest first; Apply and Commit append to the last one
	orphans      []func(error)
	lastSeq      uint64        // last sequence number handed out
	lastQueued   uint64        // last sequence number queued for the disk
	durable      uint64        // every record up to here is fsynced
	err          error         // sticky failure
	changed      chan struct{} // closed and replaced when durable, err, snapGen or closed change
	closing      bool
	closed       bool
	exited       bool // the committer returned; late callbacks go straight to f.callbacks
	compacting   bool
	forceCompact bool
	// Records nobody waits for (a Commit without a callback) are written
	// lazily: with the next record someone waits for, or once lazyDue is
	// set by lazyTimer, lazyFlush after the first of them was queued.
	urgent      int    // queued batches someone waits for
	flushTo     uint64 // a Wait wants every record up to here durable
	lazyDue     bool
	lazyTimer   *time.Timer
	gen         uint64 // generation of the journal being appended to
	snapGen     uint64 // generation of the snapshot on disk
	journalPath string // the name the appended journal has now
	// spares are buffers of frames written, kept for the next batches so
	// that group commits do not grow a new buffer from nothing each time;
	// maxSpares at most, and none above spareCap.
	spares [][]byte

	snapBytes, oldJournalBytes, journalBytes atomic.Int64

	journal       *os.File // owned by the committer
	committerDone chan struct{}
	// Owned by the committer (and Open before it starts): the mark file,
	// the newest values of the pinned keys, and the records in the
	// journal being appended to.
	mark    *markWriter // the marker's once the committer runs
	pinned  map[string][]byte
	records uint64
	// The marker: the committer hands it every fsynced frame (and every
	// callback, so callbacks keep Commit order); it records the newest in
	// the mark, one fdatasync for all of them, and then acknowledges them,
	// while the committer writes and fsyncs the next frame. Guarded by mu.
	marks      []markItem
	markWake   *sync.Cond
	markClose  bool
	markerDone chan struct{}
	// recovered is what Open with Recover dropped, nil if nothing.
	recovered *Recovery
	// watch is what checkFiles compares the paths with: the journal
	// being appended to, under the name it has now.
	watch struct {
		sync.Mutex
		journal *os.File
		path    string
	}
	stopWatch chan struct{}
	watchDone chan struct{}
	// stopped is closed when the File fails for good (Healthy says why)
	// or is closed.
	stopped     chan struct{}
	stopOnce    sync.Once
	compactions sync.WaitGroup
	// callbacks runs every Commit callback, one at a time and in order,
	// off the committer, so the next fsync never waits for the callers.
	callbacks serial
}

// batch is one future journal frame: a reserved frame header followed by
// whole records, and the Commit callbacks to run once it is durable. A
// batch without records only carries callbacks.
type batch struct {
	buf     []byte
	records int
	last    uint64
	dones   []func(error)
	urgent  bool              // someone waits for it: a callback, or an Apply
	pinned  map[string][]byte // the newest values of pinned keys it puts (nil: deletes)
}

// lazyFlush bounds how long a record nobody waits for (a Commit without
// a callback) stays queued before it is written: it goes with the next
// frame someone waits for, or after lazyFlush, whichever is first. Such
// records are cheap to delay and, under load, ride along for free instead
// of costing an fsync each.
var lazyFlush = 20 * time.Millisecond

// markUrgent records that someone waits for b. Callers hold f.mu.
func (f *File) markUrgent(b *batch) {
	if !b.urgent {
		b.urgent = true
		f.urgent++
		f.wake.Signal()
	}
}

// due reports whether the committer should write the queue now. Callers
// hold f.mu.
func (f *File) due() bool {
	return f.urgent > 0 || f.lazyDue || f.flushTo > f.durable || f.closing
}

// Open opens the state at path, creating it if missing, and replays it. It
// takes the state's lock and fails with ErrLocked, naming the path, if
// another process (or another File) holds it or holds one of its
// journals. It fails if the directory cannot be written.
func Open(path string, opts Options) (*File, error) {
	if err := CheckPath(path); err != nil {
		return nil, fmt.Errorf("open state %q: %w", path, err)
	}
	p := pathsFor(path)
	if _, err := os.Stat(p.dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(p.dir, 0o700); err != nil {
			return nil, fmt.Errorf("open state %s: create directory: %w", path, err)
		}
		if err := syncDir(filepath.Dir(p.dir), opts.NoSync); err != nil {
			return nil, fmt.Errorf("open state %s: %w", path, err)
		}
	}
	lock := flock.New(p.lock, flock.SetPermissions(0o600))
	ok, err := lock.TryLock()
	if err != nil {
		return nil, fmt.Errorf("open state %s: lock %s: %w", path, p.lock, err)
	}
	if !ok {
		return nil, fmt.Errorf("open state %s: lock %s is held: %w", path, p.lock, ErrLocked)
	}
	if err := probeDir(p, opts.NoSync); err != nil {
		lock.Unlock()
		return nil, fmt.Errorf("open state %s: %w", path, err)
	}
	journal, next, err := lockJournals(p)
	if err != nil {
		lock.Unlock()
		return nil, fmt.Errorf("open state %s: %w", path, err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &File{
		p:             p,
		opts:          opts,
		log:           log.With("state", path),
		lock:          lock,
		changed:       make(chan struct{}),
		committerDone: make(chan struct{}),
		stopped:       make(chan struct{}),
	}
	f.wake = sync.NewCond(&f.mu)
	f.markWake = sync.NewCond(&f.mu)
	f.markerDone = make(chan struct{})
	err = f.restore(journal, next)
	for _, h := range []*os.File{journal, next} {
		if h != nil && h != f.journal {
			h.Close()
		}
	}
	f.watch.journal, f.watch.path = f.journal, f.journalPath
	if err != nil {
		if f.journal != nil {
			f.journal.Close()
		}
		lock.Unlock()
		return nil, fmt.Errorf("open state %s: %w", path, err)
	}
	f.stopWatch, f.watchDone = make(chan struct{}), make(chan struct{})
	go f.commitLoop()
	go f.markLoop()
	go f.watchFiles()
	return f, nil
}

// watchInterval is how often an idle File checks that its files are
// still there; a commit checks before it is acknowledged.
var watchInterval = 500 * time.Millisecond

// watchFiles stops the File (ErrLost) once its files are gone, also while
// nothing is written, so that it stops acting before a second writer,
// which the missing lock no longer keeps out, gets far.
func (f *File) watchFiles() {
	defer close(f.watchDone)
	t := time.NewTicker(watchInterval)
	defer t.Stop()
	for {
		select {
		case <-f.stopWatch:
			return
		case <-t.C:
		}
		if err := f.checkFiles(); err != nil {
			f.fail(err)
			return
		}
	}
}

// checkFiles returns an error matching ErrLost unless the journal being
// appended to and the snapshot are still where this File put them. (The
// lock file alone may go: the journals this File holds locked keep other
// writers out, and the next Open makes a new one.)
func (f *File) checkFiles() error {
	f.watch.Lock()
	defer f.watch.Unlock()
	lost := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrLost, fmt.Sprintf(format, a...))
	}
	same, err := names(f.watch.path, f.watch.journal)
	switch {
	case err != nil:
		return err
	case !same:
		return lost("journal %s is gone or was replaced", f.watch.path)
	}
	if f.mark != nil {
		same, err := f.mark.named()
		switch {
		case err != nil:
			return err
		case !same:
			return lost("mark %s is gone or was replaced", f.p.mark)
		}
	}
	if _, err := os.Stat(f.p.snap); errors.Is(err, fs.ErrNotExist) {
		return lost("snapshot %s is gone", f.p.snap)
	} else if err != nil {
		return fmt.Errorf("stat %s: %w", f.p.snap, err)
	}
	return nil
}

// restore loads the files, repairs what a crash left behind and sets
// f.journal to the journal to append to. journal and next are the locked
// descriptors of the existing journals (nil if absent); restore reads
// through them and appends through one of them, so what it replays is
// what it locked.
func (f *File) restore(journal, next *os.File) error {
	start := time.Now()
	for _, tmp := range f.p.temps() {
		if err := os.Remove(tmp); err == nil {
			f.log.Warn("removed leftover temporary file", "file", tmp)
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", tmp, err)
		}
	}
	o := openFiles{journal: journal, next: next}
	for _, s := range []struct {
		path string
		dst  **os.File
	}{{f.p.mark, &o.mark}, {f.p.snap, &o.snap}} {
		h, err := os.Open(s.path)
		switch {
		case err == nil:
			*s.dst = h
			defer h.Close()
		case !errors.Is(err, os.ErrNotExist):
			return fmt.Errorf("open %s: %w", s.path, err)
		}
	}
	ld, err := load(f.p, o, loadOptions{keepRotation: true, recover: f.opts.Recover})
	switch {
	case errors.Is(err, errNoState):
		return f.create(start)
	case err != nil:
		return err
	}
	f.state = ld.state
	f.snapGen = ld.snapGen
	f.snapBytes.Store(ld.snapSize)
	f.pinned = f.pinnedOf(f.state)
	if ld.damage != nil || ld.markTrouble != "" {
		return f.rebuild(ld, start)
	}
	if f.opts.Recover {
		f.log.Warn("--state-recover is set but the state has no damage it would drop; remove the flag")
	}
	if ld.mark != nil && (ld.version != legacyVersion || ld.upgrading) {
		if f.mark, err = openMark(f.p.mark, *ld.mark, f.opts.NoSync); err != nil {
			return err
		}
	}
	if ld.version == legacyVersion || ld.upgrading {
		return f.upgrade(ld, start)
	}

	j := ld.chain[len(ld.chain)-1]
	if f.mark == nil {
		// A state of the previous release: from now on the mark records
		// what is acknowledged; a compaction soon writes a snapshot that
		// promises it.
		if err := f.setMark(mark{gen: j.gen, length: j.end, sum: j.lastSum, records: uint64(j.records)}); err != nil {
			return err
		}
		f.forceCompact = true
		f.log.Info("state upgraded: a mark file now records what is acknowledged", "file", f.p.mark)
	}
	f.records = uint64(j.records)
	fd := journal
	if j.path == f.p.next {
		fd = next
	}
	if j.end < j.size {
		f.log.Warn("truncating torn journal tail", "file", j.path, "offset", j.end, "bytes", j.size-j.end, "reason", j.tear)
	}
	if err := prepareAppend(fd, j.path, j.end, j.size, f.opts.NoSync); err != nil {
		return err
	}
	switch {
	case len(ld.chain) == 2:
		// A crash between steps 1 and 2 of a compaction: install the
		// snapshot it did not write, with the state at the rotation.
		f.log.Warn("finishing an interrupted compaction", "generation", j.gen)
		size, err := writeSnapshot(f.p.snap, j.gen, ld.rotation, j.end, f.opts.NoSync)
		if err != nil {
			return err
		}
		hook("finish-snapshot-installed")
		f.snapGen = j.gen
		f.snapBytes.Store(size)
		fallthrough
	case j.path == f.p.next:
		// A crash between steps 2 and 3; the journal it replaces is stale.
		if err := os.Rename(f.p.next, f.p.journal); err != nil {
			return fmt.Errorf("rename %s: %w", f.p.next, err)
		}
		if err := syncDir(f.p.dir, f.opts.NoSync); err != nil {
			return err
		}
	default:
		if err := f.removeStale(ld.stale); err != nil {
			return err
		}
	}
	f.journal = fd
	f.journalPath = f.p.journal
	f.gen = j.gen
	f.journalBytes.Store(j.end)
	f.log.Info("state opened", "keys", len(f.state), "records_replayed", ld.records(),
		"generation", j.gen, "bytes", f.Size(), "duration", time.Since(start))
	return nil
}

// upgrade turns a format-1 state into a format-2 generation before any
// write, or finishes an upgrade a crash interrupted after its snapshot
// (ld.upgrading: the journal is created, again if it exists, and renamed;
// see doc.go). Every step replaces one file by rename, and each state in
// between is one that load reads whole: the format-1 files stay the state
// until the format-2 snapshot replaces them, and that snapshot is written
// from the recovered state and promises an empty journal, which exists
// before any record is accepted.
func (f *File) upgrade(ld *loaded, start time.Time) error {
	gen := ld.snapGen
	legacy := ld.version == legacyVersion
	if legacy {
		gen = ld.maxGen + 1
		for _, j := range ld.chain {
			if j.tear != "" {
				f.log.Warn("dropping torn journal tail", "file", j.path, "offset", j.end, "bytes", j.size-j.end, "reason", j.tear)
			}
		}
	} else {
		f.log.Warn("finishing an interrupted upgrade from format 1", "generation", gen)
	}
	hook("upgrade-started")
	empty := int64(len(journalStart(gen)))
	install := func() error {
		if err := f.setMark(mark{gen: gen, length: empty, sum: startSum(gen)}); err != nil {
			return fmt.Errorf("upgrade from format %d: %w", legacyVersion, err)
		}
		size, err := writeSnapshot(f.p.snap, gen, ld.state, empty, f.opts.NoSync)
		if err != nil {
			return fmt.Errorf("upgrade from format %d: %w", legacyVersion, err)
		}
		f.snapGen = gen
		f.snapBytes.Store(size)
		hook("upgrade-snapshot-installed")
		return nil
	}
	// P.journal.next is the one name the new journal can take without
	// destroying data, unless a format-1 compaction left records there:
	// then the snapshot, which holds them, goes first.
	if legacy && ld.liveNext {
		if err := install(); err != nil {
			return err
		}
	}
	jf, err := createJournal(f.p.next, gen, f.opts.NoSync)
	if err != nil {
		return fmt.Errorf("upgrade from format %d: %w", legacyVersion, err)
	}
	hook("upgrade-journal-created")
	err = func() error {
		if legacy && !ld.liveNext {
			if err := install(); err != nil {
				return err
			}
		}
		if err := os.Rename(f.p.next, f.p.journal); err != nil {
			return fmt.Errorf("upgrade from format %d: rename %s: %w", legacyVersion, f.p.next, err)
		}
		return syncDir(f.p.dir, f.opts.NoSync)
	}()
	if err != nil {
		jf.Close()
		return err
	}
	hook("upgraded")
	f.journal = jf
	f.journalPath = f.p.journal
	f.gen = gen
	f.journalBytes.Store(empty)
	if f.mark == nil {
		// Finishing an upgrade the previous release began: its snapshot
		// promises no mark; from now on one is kept, and a compaction
		// writes a snapshot that promises it.
		if err := f.setMark(mark{gen: gen, length: empty, sum: startSum(gen)}); err != nil {
			return err
		}
		f.forceCompact = true
	}
	f.logUpgraded(ld, start)
	return nil
}

// logUpgraded reports, once per upgrade, the Open that completed it.
func (f *File) logUpgraded(ld *loaded, start time.Time) {
	f.log.Info("state upgraded", "from_format", legacyVersion, "to_format", formatVersion,
		"keys", len(f.state), "records_replayed", ld.records(), "generation", f.gen,
		"bytes", f.Size(), "duration", time.Since(start))
}

// create starts a new state: the journal first, so that a crash before
// the snapshot leaves only an empty journal, which Open recognises as no
// state; then the snapshot that promises it.
func (f *File) create(start time.Time) error {
	const gen = 1
	jf, err := createJournal(f.p.journal, gen, f.opts.NoSync)
	if err != nil {
		return err
	}
	hook("created-journal")
	f.state = make(map[string][]byte)
	f.pinned = make(map[string][]byte)
	n := int64(len(journalStart(gen)))
	if err := f.setMark(mark{gen: gen, length: n, sum: startSum(gen)}); err != nil {
		jf.Close()
		return err
	}
	size, err := writeSnapshot(f.p.snap, gen, f.state, n, f.opts.NoSync)
	if err != nil {
		jf.Close()
		return err
	}
	f.journal = jf
	f.journalPath = f.p.journal
	f.gen, f.snapGen = gen, gen
	f.snapBytes.Store(size)
	f.journalBytes.Store(n)
	f.log.Info("state created", "generation", gen, "bytes", f.Size(), "duration", time.Since(start))
	return nil
}

// prepareAppend cuts a torn tail and positions f, which path names, at end.
func prepareAppend(f *os.File, path string, end, size int64, noSync bool) error {
	if end < size {
		if err := f.Truncate(end); err != nil {
			return fileErr("truncate", path, err)
		}
		if err := syncFile(f, path, noSync); err != nil {
			return err
		}
	}
	if _, err := f.Seek(end, io.SeekStart); err != nil {
		return fileErr("seek", path, err)
	}
	return nil
}

// removeStale deletes journals that the snapshot superseded.
func (f *File) removeStale(files []string) error {
	removed := false
	for _, s := range files {
		err := os.Remove(s)
		if err == nil {
			removed = true
			continue
		}
		if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove stale journal %s: %w", s, err)
		}
	}
	if removed {
		return syncDir(f.p.dir, f.opts.NoSync)
	}
	return nil
}

// Load returns a copy of every committed key/value pair: the recovered
// state plus every batch queued so far, once those are durable. It is
// meant to be called once, before the first Commit. Values are shared and
// must not be modified. It fails with the store's failure (unless all of
// it was durable before), ErrClosed after Close, or ctx's error.
func (f *File) Load(ctx context.Context) (map[string][]byte, error) {
	f.mu.Lock()
	if f.closing && f.err == nil {
		f.mu.Unlock()
		return nil, ErrClosed
	}
	state := maps.Clone(f.state)
	last := f.lastQueued
	f.mu.Unlock()
	if err := f.Wait(ctx, last); err != nil {
		return nil, fmt.Errorf("load state: %w", err)
	}
	return state, nil
}

// Commit queues ops as one atomic record and returns without waiting. It
// copies ops. done, if not nil, is called exactly once, never from inside
// Commit, off the committer and in Commit order: with nil once the frame
// holding the record is fsynced, or with the store's sticky failure
// (ErrClosed once Close began) once it is not known to be. A record with
// no done is written lazily: with the next record that has one, at a
// Wait or Close, and at the latest lazyFlush (20 ms) after it was queued;
// records stay in order either way. Ops are visible to Snapshot and Load
// as soon as Commit returns. With no ops, done is a barrier: it runs once
// every earlier Commit's has. A record over 256 MiB stops the store,
// since later records may depend on it. done must return quickly and must
// not call Close.
func (f *File) Commit(ops []Op, done func(error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil && !f.closing && len(ops) > 0 {
		if n := recordSize(ops); n > maxRecord {
			f.failLocked(fmt.Errorf("commit a record of %d bytes: over the %d-byte limit", n, maxRecord))
		}
	}
	if f.err != nil || f.closing {
		f.orphan(done)
		return
	}
	var b *batch
	if len(ops) > 0 {
		b = f.queueLocked(ops)
	} else if n := len(f.queue); n > 0 {
		b = f.queue[n-1]
	} else if done != nil {
		b = &batch{buf: f.newBuf()}
		f.queue = append(f.queue, b)
	} else {
		return // an empty Commit nobody waits for
	}
	if done != nil {
		b.dones = append(b.dones, done)
		f.markUrgent(b)
	} else if !b.urgent && f.lazyTimer == nil && !f.lazyDue {
		f.lazyTimer = time.AfterFunc(lazyFlush, f.lazyFire)
	}
}

// lazyFire is lazyTimer's: the records nobody waits for have waited long
// enough.
func (f *File) lazyFire() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lazyTimer = nil
	// A timer that outlived its records (a waited-for frame took them)
	// must not make the next lazy record due at once.
	f.lazyDue = len(f.queue) > 0
	f.wake.Signal()
}

// orphan arranges for done to learn that its batch will never be
// written. Callers hold f.mu.
func (f *File) orphan(done func(error)) {
	if done == nil {
		return
	}
	if !f.exited {
		f.orphans = append(f.orphans, done)
		f.wake.Signal()
		return
	}
	err := f.stopErr()
	f.callbacks.post(func() { done(err) })
}

// stopErr is what a batch that will never be written reports. Callers hold
// f.mu.
func (f *File) stopErr() error {
	if f.err != nil {
		return f.err
	}
	return ErrClosed
}

// Snapshot returns a copy of the current state. Right after Open it is
// exactly the recovered state. Values are shared and must not be modified.
func (f *File) Snapshot() map[string][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.state)
}

// Apply queues ops as one atomic record and returns its sequence number;
// Wait on it to learn when it is durable. Records become durable in the
// order of the Apply calls. Apply copies the values, never touches the
// disk and is safe for concurrent use. With no ops it returns the latest
// sequence number, so Wait(Apply()) is a barrier. A record over 256 MiB is
// rejected: nothing is applied, and Apply returns a refusal number (see
// refused) that Wait always answers with the size error. A refusal keeps
// nothing in memory, however many there are.
func (f *File) Apply(ops ...Op) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(ops) == 0 {
		return f.lastSeq
	}
	if f.err != nil || f.closing {
		f.lastSeq++
		return f.lastSeq
	}
	if n := recordSize(ops); n > maxRecord {
		return refusedSeq | uint64(n)
	}
	b := f.queueLocked(ops)
	f.markUrgent(b) // Apply's callers Wait
	return b.last
}

// refusedSeq marks the numbers Apply returns for records it refused: the top
// bit set, the record's size in the others (a real sequence number never
// gets near 2^63). Wait answers them with the size error without looking
// anything up, so a refusal costs no memory.
const refusedSeq = 1 << 63

// queueLocked appends ops as the next record to the queue and to the
// in-memory state. Callers hold f.mu.
func (f *File) queueLocked(ops []Op) *batch {
	f.lastSeq++
	var b *batch
	if n := len(f.queue); n > 0 && len(f.queue[n-1].buf) < batchLimit {
		b = f.queue[n-1]
	} else {
		b = &batch{buf: f.newBuf()}
		f.queue = append(f.queue, b)
	}
	b.buf = appendRecord(b.buf, ops)
	b.records++
	b.last = f.lastSeq
	f.lastQueued = f.lastSeq
	for _, op := range ops {
		if op.Delete {
			delete(f.state, op.Key)
		} else {
			f.state[op.Key] = cloneValue(op.Value)
		}
		if f.opts.Pinned != nil && f.opts.Pinned(op.Key) {
			if b.pinned == nil {
				b.pinned = make(map[string][]byte)
			}
			b.pinned[op.Key] = f.state[op.Key]
		}
	}
	// No wake-up here: a record is due only once someone waits for it
	// (markUrgent, Wait, Close) or lazyFire, and those wake the committer.
	return b
}

// Wait returns nil once the record seq and all before it are durable. If
// the store has failed it returns that failure for every seq that was not
// durable by then, forever.
// Records applied after Close began are never written: Wait returns
// ErrClosed for them.
func (f *File) Wait(ctx context.Context, seq uint64) error {
	if seq&refusedSeq != 0 {
		return fmt.Errorf("record of %d bytes exceeds the %d-byte limit; nothing was applied", seq&^refusedSeq, maxRecord)
	}
	for {
		f.mu.Lock()
		switch {
		case seq <= f.durable:
			// Also after a failure: a durable record is not refused.
			f.mu.Unlock()
			return nil
		case f.err != nil:
			err := f.err
			f.mu.Unlock()
			return err
		case seq > f.lastSeq:
			last := f.lastSeq
			f.mu.Unlock()
			return fmt.Errorf("wait for record %d: only %d applied", seq, last)
		case seq > f.lastQueued && (f.closing || f.closed):
			f.mu.Unlock()
			return ErrClosed
		}
		if seq > f.flushTo {
			f.flushTo = seq
			f.wake.Signal()
		}
		ch := f.changed
		f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("wait for record %d: %w", seq, ctx.Err())
		}
	}
}

// Healthy returns the failure that stopped the store, ErrClosed after
// Close, or nil.
func (f *File) Healthy() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	if f.closed {
		return ErrClosed
	}
	return nil
}

// Stopped is closed once the File has failed for good (Healthy returns
// the failure) or has been closed (Healthy returns ErrClosed). A failure matching ErrLost means the state's files are gone:
// the process must stop acting, since nothing it does is recorded any more
// and another writer may have started.
func (f *File) Stopped() <-chan struct{} { return f.stopped }

// Size returns the bytes on disk: snapshot plus journal(s).
func (f *File) Size() int64 {
	return f.snapBytes.Load() + f.oldJournalBytes.Load() + f.journalBytes.Load()
}

// Close writes and fsyncs everything queued, runs the callbacks of every
// Commit so far, waits for a running compaction and releases the locks.
// It returns the store's failure, if any. Calling it again returns nil.
func (f *File) Close() error {
	f.mu.Lock()
	if f.closing {
		f.mu.Unlock()
		<-f.committerDone
		return nil
	}
	f.closing = true
	f.wake.Broadcast()
	f.mu.Unlock()

	close(f.stopWatch)
	<-f.watchDone
	<-f.committerDone
	f.mu.Lock()
	if f.lazyTimer != nil {
		f.lazyTimer.Stop()
		f.lazyTimer = nil
	}
	f.mu.Unlock()
	f.callbacks.wait()
	f.compactions.Wait()
	var errs []error
	if err := f.journal.Close(); err != nil {
		errs = append(errs, fileErr("close", f.journalPath, err))
	}
	if err := f.mark.close(); err != nil {
		errs = append(errs, fileErr("close", f.p.mark, err))
	}
	if err := f.lock.Unlock(); err != nil {
		errs = append(errs, fmt.Errorf("unlock %s: %w", f.p.lock, err))
	}
	f.mu.Lock()
	if f.err != nil {
		errs = append([]error{f.err}, errs...)
	}
	f.closed = true
	f.notify()
	f.mu.Unlock()
	f.stopOnce.Do(func() { close(f.stopped) })
	return errors.Join(errs...)
}

// notify wakes every Wait. Callers hold f.mu.
func (f *File) notify() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// fail stops the store for good.
func (f *File) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failLocked(err)
}

// failLocked stops the store: every queued batch is dropped and its
// callbacks join the orphans, ahead of later ones. Callers hold f.mu.
func (f *File) failLocked(err error) {
	if f.err != nil {
		return
	}
	f.err = fmt.Errorf("state %s failed: %w", f.p.base, err)
	f.stopOnce.Do(func() { close(f.stopped) })
	var dones []func(error)
	for _, b := range f.queue {
		dones = append(dones, b.dones...)
	}
	f.orphans = append(dones, f.orphans...)
	f.queue, f.urgent = nil, 0
	f.log.Error("state store failed", "err", err)
	f.notify()
	f.wake.Broadcast()
}

// threshold is the journal size that starts a compaction, 0 for never.
// Callers hold f.mu.
func (f *File) threshold() int64 {
	switch c := f.opts.CompactBytes; {
	case c < 0:
		return 0
	case c > 0:
		return c
	default:
		return max(DefaultCompactBytes, 2*f.snapBytes.Load())
	}
}

// needCompact reports whether the committer should cut a new generation.
// Callers hold f.mu.
func (f *File) needCompact() bool {
	if f.closing || f.compacting || f.err != nil {
		return false
	}
	t := f.threshold()
	return f.forceCompact || (t > 0 && f.journalBytes.Load() >= t)
}

// commitLoop is the only writer of the journal and the only caller of
// Commit callbacks until Close: it takes the oldest queued batch, appends
// it as one frame, fsyncs, publishes the new durable sequence number and
// runs the batch's callbacks. Between batches it starts compactions. After
// a failure, and once Close has flushed the queue, it runs the callbacks
// of batches that will never be written.
func (f *File) commitLoop() {
	defer close(f.committerDone)
	for {
		f.mu.Lock()
		for (len(f.queue) == 0 || !f.due()) && len(f.orphans) == 0 && !f.closing && !f.needCompact() {
			f.wake.Wait()
		}
		if len(f.queue) == 0 {
			if len(f.orphans) > 0 {
				dones, err := f.orphans, f.stopErr()
				f.orphans = nil
				f.mu.Unlock()
				f.run(dones, err)
				continue
			}
			if f.closing {
				// Everything handed to the marker is acknowledged (or
				// failed) before callbacks may bypass it.
				f.markClose = true
				f.markWake.Signal()
				f.mu.Unlock()
				<-f.markerDone
				// Callbacks orphaned while the marker finished go now, ahead
				// of any later ones (which orphan posts directly from here
				// on).
				f.mu.Lock()
				f.exited = true
				dones, err := f.orphans, f.stopErr()
				f.orphans = nil
				f.post(dones, err)
				f.mu.Unlock()
				return
			}
		}
		var b *batch
		if len(f.queue) > 0 {
			b = f.queue[0]
			f.queue[0] = nil
			f.queue = f.queue[1:]
			if b.urgent {
				f.urgent--
			}
			if len(f.queue) == 0 {
				f.lazyDue = false
			}
		}
		// The clone equals the journal's content only if nothing else is
		// queued behind b.
		var snap map[string][]byte
		var gen uint64
		current := f.gen // the generation b goes to
		if len(f.queue) == 0 && f.needCompact() {
			snap = maps.Clone(f.state)
			f.compacting, f.forceCompact = true, false
			f.gen++
			gen = f.gen
		}
		path := f.journalPath
		f.mu.Unlock()

		if b != nil {
			if committerHook != nil {
				committerHook()
			}
			if err := f.commit(b, path, current); err != nil {
				f.mu.Lock()
				f.failLocked(err)
				err = f.err
				f.mu.Unlock()
				f.run(b.dones, err)
				continue
			}
		}
		if snap != nil {
			if err := f.rotate(gen, snap, path); err != nil {
				f.fail(err)
			}
		}
	}
}

// spareCap bounds each buffer a File keeps between frames: a frame above
// it (a burst) is left to the collector rather than held for good.
const spareCap = 1 << 20

// maxSpares bounds how many buffers a File keeps between frames. Under
// load two are in use at once: the frame being written and synced, and
// the batch filling meanwhile. With one kept, a frame handed back while
// one was still kept pushed that one out, and the next batch grew a new
// buffer from 4 KiB; two kept cover both.
const maxSpares = 2

// newBuf returns an empty frame buffer, a kept one if there is one.
// Callers hold f.mu.
func (f *File) newBuf() []byte {
	if n := len(f.spares); n > 0 {
		b := f.spares[n-1]
		f.spares[n-1] = nil
		f.spares = f.spares[:n-1]
		return b[:frameHeaderSize]
	}
	return make([]byte, frameHeaderSize, 4096)
}

// keepSpare keeps buf, a frame the journal holds now (nothing refers to
// it any longer), for a next batch, unless it is above spareCap. With
// maxSpares kept already, the smallest of them and buf is dropped.
// Callers hold f.mu.
func (f *File) keepSpare(buf []byte) {
	if cap(buf) > spareCap {
		return
	}
	if len(f.spares) < maxSpares {
		f.spares = append(f.spares, buf)
		return
	}
	small := 0
	for i, s := range f.spares {
		if cap(s) < cap(f.spares[small]) {
			small = i
		}
	}
	if cap(buf) > cap(f.spares[small]) {
		f.spares[small] = buf
	}
}

// commit appends b as one frame to the journal of gen, which path names,
// fsyncs it and hands it to the marker, which acknowledges it once the
// mark records it.
func (f *File) commit(b *batch, path string, gen uint64) error {
	if b.records == 0 {
		// A barrier: its buffer (a bare header) holds nothing to write.
		f.mu.Lock()
		f.keepSpare(b.buf)
		f.mu.Unlock()
		f.run(b.dones, nil)
		return nil
	}
	putFrameHeader(b.buf)
	if _, err := f.journal.Write(b.buf); err != nil {
		return fileErr("append to", path, err)
	}
	start := time.Now()
	if err := syncFile(f.journal, path, f.opts.NoSync); err != nil {
		return err
	}
	if len(b.pinned) > 0 {
		// Copied, since the marker may still be writing the previous one.
		pinned := maps.Clone(f.pinned)
		for k, v := range b.pinned {
			if v == nil {
				delete(pinned, k)
			} else {
				pinned[k] = v
			}
		}
		f.pinned = pinned
	}
	f.records += uint64(b.records)
	end := f.journalBytes.Add(int64(len(b.buf)))
	m := mark{gen: gen, length: end, sum: frameSum(b.buf), records: f.records, pinned: f.pinned}
	f.hand(markItem{mark: &m, last: b.last, dones: b.dones, records: b.records, bytes: len(b.buf), start: start}, b.buf)
	return nil
}

// markItem is what the committer hands the marker: a frame to record in
// the mark (mark set) and acknowledge, or callbacks to run with err in
// their place in the order.
type markItem struct {
	mark    *mark
	last    uint64
	dones   []func(error)
	err     error
	records int
	bytes   int
	start   time.Time
}

// hand queues it for the marker. written, if not nil, is the buffer of
// the frame it records, kept for the next batch under the same lock (and
// so before the frame can be acknowledged).
func (f *File) hand(it markItem, written []byte) {
	f.mu.Lock()
	f.marks = append(f.marks, it)
	f.markWake.Signal()
	if written != nil {
		f.keepSpare(written)
	}
	f.mu.Unlock()
}

// run hands callbacks to the callback runner through the marker, so they
// keep their place after the acknowledgements before them.
func (f *File) run(dones []func(error), err error) {
	if len(dones) == 0 {
		return
	}
	f.hand(markItem{dones: dones, err: err}, nil)
}

// post runs callbacks on the callback runner, in order.
func (f *File) post(dones []func(error), err error) {
	if len(dones) == 0 {
		return
	}
	f.callbacks.post(func() {
		for _, done := range dones {
			done(err)
		}
	})
}

// markerHook and committerHook, set only by tests, are called each time
// the marker wakes for work, before it takes the items, and each time the
// committer took a batch off the queue, before it writes it.
var markerHook, committerHook func()

// markLoop is the marker: it takes every item queued, writes the newest
// mark among them (one fdatasync covers them all), checks the files are
// still the ones a later Open reads, publishes the durable sequence number
// and runs the callbacks in order.
//
// Every frame it is handed was appended and fsynced before any failure
// that may have stopped the store since, and Open replays it whatever the
// mark says, so it is marked and acknowledged even then: refusing it
// would tell a caller "not applied" about a record a restart applies (a
// full disk refusing the next frame while the marker was busy did that).
// Only once the mark itself could not be written, or the files are no
// longer the ones a later Open reads, nothing more is acknowledged: the
// items get the store's failure.
func (f *File) markLoop() {
	defer close(f.markerDone)
	var broken bool // a mark write or file check failed: no more marks
	for {
		f.mu.Lock()
		for len(f.marks) == 0 && !f.markClose {
			f.markWake.Wait()
		}
		f.mu.Unlock()
		if markerHook != nil {
			markerHook()
		}
		f.mu.Lock()
		items := f.marks
		f.marks = nil
		f.mu.Unlock()
		if len(items) == 0 {
			return
		}
		var newest *markItem
		for i := range items {
			if items[i].mark != nil {
				newest = &items[i]
			}
		}
		var err error
		if newest != nil && !broken {
			err = f.mark.write(*newest.mark)
			if err == nil {
				// The frames count only if a later Open will read them.
				err = f.checkFiles()
			}
			if err != nil {
				broken = true
				f.fail(err)
			}
		}
		if newest != nil && (err != nil || broken) {
			f.mu.Lock()
			err = f.err
			f.mu.Unlock()
		}
		if newest != nil && err == nil {
			f.mu.Lock()
			f.durable = newest.last
			f.notify()
			f.mu.Unlock()
		}
		for _, it := range items {
			switch {
			case it.mark == nil:
				f.post(it.dones, it.err)
			case err != nil:
				f.post(it.dones, err)
			default:
				f.post(it.dones, nil)
				if f.opts.OnCommit != nil {
					f.opts.OnCommit(it.records, it.bytes, time.Since(it.start))
				}
			}
		}
	}
}

// rotate is step 1 of a compaction: create the journal of gen, seal the
// one at path (which promises the new one to recovery, so it is written
// only once the new one is durable, and before any record goes to it),
// switch appends to the new one, and hand the old one and the clone to a
// background goroutine.
func (f *File) rotate(gen uint64, snap map[string][]byte, path string) error {
	next, err := createJournal(f.p.next, gen, f.opts.NoSync)
	if err != nil {
		return fmt.Errorf("compact to generation %d: %w", gen, err)
	}
	hook("next-created")
	seal := controlFrame(ctlSeal, gen)
	if _, err := f.journal.Write(seal); err != nil {
		next.Close()
		return fileErr("seal", path, err)
	}
	if err := syncFile(f.journal, path, f.opts.NoSync); err != nil {
		next.Close()
		return err
	}
	hook("sealed")
	old := f.journal
	f.journal = next
	f.mu.Lock()
	f.journalPath = f.p.next
	f.mu.Unlock()
	f.watch.Lock()
	f.watch.journal, f.watch.path = next, f.p.next
	f.watch.Unlock()
	f.oldJournalBytes.Store(f.journalBytes.Load() + int64(len(seal)))
	f.journalBytes.Store(int64(len(journalStart(gen))))
	f.records = 0
	f.compactions.Add(1)
	go f.compact(gen, snap, old)
	return nil
}

// compact is steps 2 and 3 of a compaction. old, the sealed journal, stays
// open, and so locked, until the new journal has replaced it.
func (f *File) compact(gen uint64, snap map[string][]byte, old *os.File) {
	defer f.compactions.Done()
	defer old.Close()
	start := time.Now()
	hook("rotated")
	// Every byte of the new journal counted so far is fsynced.
	size, err := writeSnapshot(f.p.snap, gen, snap, f.journalBytes.Load(), f.opts.NoSync)
	if err == nil {
		hook("snapshot-installed")
		f.watch.Lock()
		err = os.Rename(f.p.next, f.p.journal)
		if err == nil {
			f.watch.path = f.p.journal
		}
		f.watch.Unlock()
		if err != nil {
			err = fmt.Errorf("rename %s: %w", f.p.next, err)
		} else {
			f.mu.Lock()
			f.journalPath = f.p.journal
			f.mu.Unlock()
			err = syncDir(f.p.dir, f.opts.NoSync)
		}
	}
	if err != nil {
		f.fail(fmt.Errorf("compact to generation %d: %w", gen, err))
		return
	}
	f.snapBytes.Store(size)
	f.oldJournalBytes.Store(0)
	f.mu.Lock()
	f.compacting = false
	f.snapGen = gen
	f.notify()
	f.wake.Signal()
	f.mu.Unlock()
	f.log.Info("state compacted", "generation", gen, "keys", len(snap), "snapshot_bytes", size, "duration", time.Since(start))
}

// compactNow forces a compaction and waits until one that includes every
// record applied so far has finished.
func (f *File) compactNow(ctx context.Context) error {
	f.mu.Lock()
	want := f.gen + 1
	f.forceCompact = true
	f.wake.Signal()
	f.mu.Unlock()
	for {
		f.mu.Lock()
		done, err, closed := f.snapGen >= want, f.err, f.closing
		ch := f.changed
		f.mu.Unlock()
		switch {
		case err != nil:
			return err
		case done:
			return nil
		case closed:
			return ErrClosed
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
