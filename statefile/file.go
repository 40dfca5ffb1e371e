package statefile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofrs/flock"
)

// Op is one change: a put of Value under Key, or a delete of Key.
type Op struct {
	Key    string
	Value  []byte
	Delete bool
}

// Store is what the desired document persists through. File and Memory
// implement it.
type Store interface {
	// Snapshot returns a copy of the current state: the recovered state
	// plus every op applied since. Values must not be modified.
	Snapshot() map[string][]byte
	// Apply queues ops as one atomic record and returns its sequence
	// number. It never waits for the disk.
	Apply(ops ...Op) uint64
	// Wait returns nil once every record up to seq is durable.
	Wait(ctx context.Context, seq uint64) error
	// Healthy returns the error that stopped the store, if any.
	Healthy() error
	// Size is the store's footprint in bytes, for metrics.
	Size() int64
	// Close flushes what is queued and releases the store.
	Close() error
}

var (
	_ Store = (*File)(nil)
	_ Store = (*Memory)(nil)
)

var (
	// ErrLocked is returned by Open when another holder has the state.
	ErrLocked = errors.New("state is locked by another process")
	// ErrClosed is returned for records that were never written because
	// the store was closed.
	ErrClosed = errors.New("state store is closed")
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
	// of records and bytes it made durable and how long the fsync took. It
	// runs on the commit goroutine and must return quickly.
	OnCommit func(records int, bytes int, fsync time.Duration)
	// NoSync skips every fsync. Only for tests: a crash loses data.
	NoSync bool
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
	queue        []*batch // oldest first; Apply appends to the last one
	lastSeq      uint64   // last sequence number handed out
	lastQueued   uint64   // last sequence number queued for the disk
	durable      uint64   // every record up to here is fsynced
	rejected     map[uint64]error
	err          error         // sticky failure
	changed      chan struct{} // closed and replaced when durable, err, snapGen or closed change
	closing      bool
	closed       bool
	compacting   bool
	forceCompact bool
	gen          uint64 // generation of the journal being appended to
	snapGen      uint64 // generation of the snapshot on disk

	snapBytes, oldJournalBytes, journalBytes atomic.Int64

	journal       *os.File // owned by the committer
	committerDone chan struct{}
	compactions   sync.WaitGroup
}

// batch is one future journal frame: a reserved frame header followed by
// whole records.
type batch struct {
	buf     []byte
	records int
	last    uint64
}

// Open opens the state at path, creating it if missing, and replays it. It
// takes the state's lock and fails with ErrLocked, naming the path, if
// another process (or another File) holds it.
func Open(path string, opts Options) (*File, error) {
	if path == "" {
		return nil, errors.New("open state: empty path")
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
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &File{
		p:             p,
		opts:          opts,
		log:           log.With("state", path),
		lock:          lock,
		rejected:      make(map[uint64]error),
		changed:       make(chan struct{}),
		committerDone: make(chan struct{}),
	}
	f.wake = sync.NewCond(&f.mu)
	if err := f.restore(); err != nil {
		lock.Unlock()
		return nil, fmt.Errorf("open state %s: %w", path, err)
	}
	go f.commitLoop()
	return f, nil
}

// restore loads the files, repairs what a crash left behind and opens the
// journal for appending.
func (f *File) restore() error {
	start := time.Now()
	for _, tmp := range f.p.temps() {
		if err := os.Remove(tmp); err == nil {
			f.log.Warn("removed leftover temporary file", "file", tmp)
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", tmp, err)
		}
	}
	o, err := openAll(f.p)
	if err != nil {
		return err
	}
	ld, err := load(f.p, o)
	o.close()
	switch {
	case errors.Is(err, errNoState):
		ld = &loaded{state: make(map[string][]byte)}
	case err != nil:
		return err
	}
	f.state = ld.state
	f.snapGen = ld.snapGen
	f.snapBytes.Store(ld.snapSize)

	var j *journalInfo
	if len(ld.chain) == 1 {
		j = &ld.chain[0]
	}
	switch {
	case j != nil && j.path == f.p.journal:
		// The common case; at most a stale .next from an earlier repair.
		if err := f.removeStale(ld.stale); err != nil {
			return err
		}
	case j != nil && j.path == f.p.next:
		// The crash hit between steps 2 and 3 of a compaction.
		f.log.Warn("finishing an interrupted compaction", "generation", j.gen)
		if err := os.Rename(f.p.next, f.p.journal); err != nil {
			return fmt.Errorf("rename %s: %w", f.p.next, err)
		}
		if err := syncDir(f.p.dir, f.opts.NoSync); err != nil {
			return err
		}
		j.path = f.p.journal
	default:
		// New state, a crash before step 2 of a compaction (two journals),
		// or a snapshot without its journal: write everything afresh.
		if ld.snapGen != 0 {
			f.log.Warn("rewriting state after an interrupted compaction", "journals", len(ld.chain), "generation", ld.maxGen+1)
		}
		return f.rewrite(ld, start)
	}
	if j.end < j.size {
		f.log.Warn("truncating torn journal tail", "file", j.path, "offset", j.end, "bytes", j.size-j.end, "reason", j.tear)
	}
	jf, err := os.OpenFile(j.path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", j.path, err)
	}
	if err := prepareAppend(jf, j.end, j.size, f.opts.NoSync); err != nil {
		jf.Close()
		return err
	}
	f.journal = jf
	f.gen = j.gen
	f.journalBytes.Store(j.end)
	f.log.Info("state opened", "keys", len(f.state), "records_replayed", j.records,
		"generation", j.gen, "bytes", f.Size(), "duration", time.Since(start))
	return nil
}

// prepareAppend cuts a torn tail and positions f at end.
func prepareAppend(f *os.File, end, size int64, noSync bool) error {
	if end < size {
		if err := f.Truncate(end); err != nil {
			return fmt.Errorf("truncate %s: %w", f.Name(), err)
		}
		if err := syncFile(f, noSync); err != nil {
			return err
		}
	}
	if _, err := f.Seek(end, io.SeekStart); err != nil {
		return fmt.Errorf("seek %s: %w", f.Name(), err)
	}
	return nil
}

// rewrite writes the loaded state as a new generation and starts an empty
// journal for it; every existing journal becomes stale the moment the
// snapshot is renamed into place.
func (f *File) rewrite(ld *loaded, start time.Time) error {
	gen := ld.maxGen + 1
	size, err := writeSnapshot(f.p.snap, gen, f.state, f.opts.NoSync)
	if err != nil {
		return err
	}
	hook("rewrite-snapshot-installed")
	jf, err := createJournal(f.p.journal, gen, f.opts.NoSync)
	if err != nil {
		return err
	}
	if err := f.removeStale([]string{f.p.next}); err != nil {
		jf.Close()
		return err
	}
	f.journal = jf
	f.gen, f.snapGen = gen, gen
	f.snapBytes.Store(size)
	f.journalBytes.Store(headerSize)
	f.log.Info("state opened", "keys", len(f.state), "generation", gen, "bytes", f.Size(), "duration", time.Since(start))
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
// rejected: Wait on it returns an error and nothing is applied.
func (f *File) Apply(ops ...Op) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(ops) == 0 {
		return f.lastSeq
	}
	f.lastSeq++
	seq := f.lastSeq
	if f.err != nil || f.closing {
		return seq
	}
	if n := recordSize(ops); n > maxRecord {
		f.rejected[seq] = fmt.Errorf("record %d of %d bytes exceeds the %d-byte limit", seq, n, maxRecord)
		return seq
	}
	var b *batch
	if n := len(f.queue); n > 0 && len(f.queue[n-1].buf) < batchLimit {
		b = f.queue[n-1]
	} else {
		b = &batch{buf: make([]byte, frameHeaderSize, 4096)}
		f.queue = append(f.queue, b)
	}
	b.buf = appendRecord(b.buf, ops)
	b.records++
	b.last = seq
	f.lastQueued = seq
	for _, op := range ops {
		if op.Delete {
			delete(f.state, op.Key)
		} else {
			f.state[op.Key] = cloneValue(op.Value)
		}
	}
	f.wake.Signal()
	return seq
}

// Wait returns nil once the record seq and all before it are durable. If
// the store has failed it returns that failure, for every seq, forever.
// Records applied after Close began are never written: Wait returns
// ErrClosed for them.
func (f *File) Wait(ctx context.Context, seq uint64) error {
	for {
		f.mu.Lock()
		switch {
		case f.err != nil:
			err := f.err
			f.mu.Unlock()
			return err
		case f.rejected[seq] != nil:
			err := f.rejected[seq]
			f.mu.Unlock()
			return err
		case seq <= f.durable:
			f.mu.Unlock()
			return nil
		case seq > f.lastSeq:
			last := f.lastSeq
			f.mu.Unlock()
			return fmt.Errorf("wait for record %d: only %d applied", seq, last)
		case seq > f.lastQueued && (f.closing || f.closed):
			f.mu.Unlock()
			return ErrClosed
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

// Size returns the bytes on disk: snapshot plus journal(s).
func (f *File) Size() int64 {
	return f.snapBytes.Load() + f.oldJournalBytes.Load() + f.journalBytes.Load()
}

// Close writes and fsyncs everything queued, waits for a running
// compaction and releases the lock. It returns the store's failure, if
// any. Calling it again returns nil.
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

	<-f.committerDone
	f.compactions.Wait()
	var errs []error
	if err := f.journal.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close %s: %w", f.journal.Name(), err))
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
	if f.err != nil {
		return
	}
	f.err = fmt.Errorf("state %s failed: %w", f.p.base, err)
	f.queue = nil
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

// commitLoop is the only writer of the journal: it takes the oldest queued
// batch, appends it as one frame, fsyncs, and publishes the new durable
// sequence number. Between batches it starts compactions.
func (f *File) commitLoop() {
	defer close(f.committerDone)
	for {
		f.mu.Lock()
		for len(f.queue) == 0 && !f.closing && f.err == nil && !f.needCompact() {
			f.wake.Wait()
		}
		if f.err != nil || (f.closing && len(f.queue) == 0) {
			f.mu.Unlock()
			return
		}
		var b *batch
		if len(f.queue) > 0 {
			b = f.queue[0]
			f.queue[0] = nil
			f.queue = f.queue[1:]
		}
		// The clone equals the journal's content only if nothing else is
		// queued behind b.
		var snap map[string][]byte
		var gen uint64
		if len(f.queue) == 0 && f.needCompact() {
			snap = maps.Clone(f.state)
			f.compacting, f.forceCompact = true, false
			f.gen++
			gen = f.gen
		}
		f.mu.Unlock()

		if b != nil {
			if err := f.commit(b); err != nil {
				f.fail(err)
				return
			}
		}
		if snap != nil {
			if err := f.rotate(gen, snap); err != nil {
				f.fail(err)
				return
			}
		}
	}
}

// commit appends b as one frame and fsyncs it.
func (f *File) commit(b *batch) error {
	putFrameHeader(b.buf)
	if _, err := f.journal.Write(b.buf); err != nil {
		return fmt.Errorf("append to %s: %w", f.journal.Name(), err)
	}
	start := time.Now()
	if err := syncFile(f.journal, f.opts.NoSync); err != nil {
		return err
	}
	took := time.Since(start)
	f.journalBytes.Add(int64(len(b.buf)))
	f.mu.Lock()
	f.durable = b.last
	f.notify()
	f.mu.Unlock()
	if f.opts.OnCommit != nil {
		f.opts.OnCommit(b.records, len(b.buf), took)
	}
	return nil
}

// rotate is step 1 of a compaction: switch appends to a fresh journal of
// gen and hand the old one and the clone to a background goroutine.
func (f *File) rotate(gen uint64, snap map[string][]byte) error {
	next, err := createJournal(f.p.next, gen, f.opts.NoSync)
	if err != nil {
		return fmt.Errorf("compact to generation %d: %w", gen, err)
	}
	old := f.journal
	f.journal = next
	f.oldJournalBytes.Store(f.journalBytes.Load())
	f.journalBytes.Store(headerSize)
	f.compactions.Add(1)
	go f.compact(gen, snap, old)
	return nil
}

// compact is steps 2 and 3 of a compaction.
func (f *File) compact(gen uint64, snap map[string][]byte, old *os.File) {
	defer f.compactions.Done()
	start := time.Now()
	old.Close()
	hook("rotated")
	size, err := writeSnapshot(f.p.snap, gen, snap, f.opts.NoSync)
	if err == nil {
		hook("snapshot-installed")
		err = os.Rename(f.p.next, f.p.journal)
		if err != nil {
			err = fmt.Errorf("rename %s: %w", f.p.next, err)
		} else {
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
