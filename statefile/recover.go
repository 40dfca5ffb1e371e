package statefile

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// paths names the files of one state; see doc.go.
type paths struct {
	base, dir, snap, journal, next, lock string
}

func pathsFor(p string) paths {
	return paths{
		base:    p,
		dir:     filepath.Dir(p),
		snap:    p + ".snap",
		journal: p + ".journal",
		next:    p + ".journal.next",
		lock:    p + ".lock",
	}
}

func (p paths) temps() []string {
	return []string{p.snap + ".tmp", p.journal + ".tmp", p.next + ".tmp"}
}

// errNoState means none of the state's files exist.
var errNoState = errors.New("no state")

// openFiles holds read-only descriptors for the files that existed when
// they were opened; nil means absent.
type openFiles struct {
	snap, journal, next *os.File
}

func openAll(p paths) (openFiles, error) {
	var o openFiles
	for _, s := range []struct {
		path string
		f    **os.File
	}{{p.snap, &o.snap}, {p.journal, &o.journal}, {p.next, &o.next}} {
		f, err := os.Open(s.path)
		switch {
		case err == nil:
			*s.f = f
		case errors.Is(err, fs.ErrNotExist):
		default:
			o.close()
			return openFiles{}, fmt.Errorf("open %s: %w", s.path, err)
		}
		if s.path == p.journal {
			hook("opened-journal")
		}
	}
	return o, nil
}

func (o openFiles) close() {
	for _, f := range []*os.File{o.snap, o.journal, o.next} {
		if f != nil {
			f.Close()
		}
	}
}

// unchanged reports whether every path still names the file (or absence)
// that openAll found. Because files only move forward, an unchanged set
// means the set was, at the moment the last one was opened, exactly what
// the directory held.
func (o openFiles) unchanged(p paths) (bool, error) {
	for _, s := range []struct {
		path string
		f    *os.File
	}{{p.snap, o.snap}, {p.journal, o.journal}, {p.next, o.next}} {
		now, err := os.Stat(s.path)
		if errors.Is(err, fs.ErrNotExist) {
			if s.f != nil {
				return false, nil
			}
			continue
		}
		if err != nil {
			return false, fmt.Errorf("stat %s: %w", s.path, err)
		}
		if s.f == nil {
			return false, nil
		}
		was, err := s.f.Stat()
		if err != nil {
			return false, fmt.Errorf("stat %s: %w", s.path, err)
		}
		if !os.SameFile(now, was) {
			return false, nil
		}
	}
	return true, nil
}

// journalInfo describes one journal that was replayed.
type journalInfo struct {
	path    string
	gen     uint64
	size    int64 // file length when read
	end     int64 // end of the last whole frame; < size means a torn tail
	records int
	tear    string // why the tail was judged torn
}

// loaded is what the files of a state say.
type loaded struct {
	state    map[string][]byte
	snapGen  uint64
	snapSize int64
	chain    []journalInfo // replayed, oldest first
	stale    []string      // journals older than the snapshot, ignored
	maxGen   uint64
}

// load replays the snapshot and the journals that continue it. Only the
// last journal of the chain may end in a torn frame.
func load(p paths, o openFiles) (*loaded, error) {
	if o.snap == nil {
		for _, s := range []struct {
			path string
			f    *os.File
		}{{p.journal, o.journal}, {p.next, o.next}} {
			if s.f != nil {
				return nil, fmt.Errorf("snapshot %s is missing but journal %s exists: %w", p.snap, s.path, ErrCorrupt)
			}
		}
		return nil, errNoState
	}
	ld := &loaded{state: make(map[string][]byte)}
	h, size, err := readSnapshot(p.snap, o.snap, ld.state)
	if err != nil {
		return nil, err
	}
	ld.snapGen, ld.snapSize, ld.maxGen = h.gen, size, h.gen

	type candidate struct {
		path string
		f    *os.File
		gen  uint64
		size int64
	}
	var chain []candidate
	for _, s := range []struct {
		path string
		f    *os.File
	}{{p.journal, o.journal}, {p.next, o.next}} {
		if s.f == nil {
			continue
		}
		h, size, err := readHeader(s.path, s.f, kindJournal)
		if err != nil {
			return nil, err
		}
		ld.maxGen = max(ld.maxGen, h.gen)
		switch {
		case h.gen < ld.snapGen:
			ld.stale = append(ld.stale, s.path)
		case h.gen > ld.snapGen+1:
			return nil, corrupt(s.path, 12, "journal generation %d is ahead of snapshot %s generation %d", h.gen, p.snap, ld.snapGen)
		default:
			chain = append(chain, candidate{s.path, s.f, h.gen, size})
		}
	}
	slices.SortFunc(chain, func(a, b candidate) int { return cmp.Compare(a.gen, b.gen) })
	if len(chain) == 2 && chain[0].gen == chain[1].gen {
		return nil, corrupt(chain[1].path, 12, "journal generation %d duplicates %s", chain[1].gen, chain[0].path)
	}
	if len(chain) > 0 && chain[0].gen != ld.snapGen {
		return nil, corrupt(chain[0].path, 12, "journal generation %d continues generation %d, but no journal of generation %d exists", chain[0].gen, ld.snapGen, ld.snapGen)
	}
	for i, c := range chain {
		info, err := replayJournal(c.path, c.f, c.size, ld.state, i == len(chain)-1)
		if err != nil {
			return nil, err
		}
		info.gen = c.gen
		ld.chain = append(ld.chain, info)
	}
	return ld, nil
}

func readHeader(path string, f *os.File, kind byte) (fileHeader, int64, error) {
	st, err := f.Stat()
	if err != nil {
		return fileHeader{}, 0, fmt.Errorf("stat %s: %w", path, err)
	}
	b := make([]byte, headerSize)
	n, err := f.ReadAt(b, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return fileHeader{}, 0, fmt.Errorf("read %s: %w", path, err)
	}
	h, err := decodeHeader(path, b[:n], kind)
	if err != nil {
		return fileHeader{}, 0, err
	}
	return h, st.Size(), nil
}

// readSnapshot loads a snapshot into state. A snapshot is complete before
// it is renamed into place, so every fault is corruption.
func readSnapshot(path string, f *os.File, state map[string][]byte) (fileHeader, int64, error) {
	h, size, err := readHeader(path, f, kindSnapshot)
	if err != nil {
		return fileHeader{}, 0, err
	}
	fr := newFrameReader(path, f, size)
	var entries uint64
	for {
		payload, fault, err := fr.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fileHeader{}, 0, err
		}
		if fault != nil {
			return fileHeader{}, 0, corrupt(path, fault.off, "%s", fault.reason)
		}
		n, err := applySnapshotPayload(payload, state)
		if err != nil {
			return fileHeader{}, 0, corrupt(path, fr.off-int64(len(payload))-frameHeaderSize, "%v", err)
		}
		entries += uint64(n)
	}
	if entries != h.count {
		return fileHeader{}, 0, corrupt(path, size, "snapshot holds %d entries, header says %d", entries, h.count)
	}
	return h, size, nil
}

// replayJournal applies a journal's frames to state. With allowTorn, a
// fault that an interrupted final write explains ends the replay instead
// of failing it.
func replayJournal(path string, f *os.File, size int64, state map[string][]byte, allowTorn bool) (journalInfo, error) {
	info := journalInfo{path: path, size: size}
	fr := newFrameReader(path, f, size)
	for {
		payload, fault, err := fr.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return journalInfo{}, err
		}
		if fault != nil {
			if allowTorn && fault.mayBeTorn {
				info.tear = fault.reason
				break
			}
			return journalInfo{}, corrupt(path, fault.off, "%s", fault.reason)
		}
		n, err := applyJournalPayload(payload, state)
		if err != nil {
			return journalInfo{}, corrupt(path, fr.off-int64(len(payload))-frameHeaderSize, "%v", err)
		}
		info.records += n
	}
	info.end = fr.off
	return info, nil
}

// ReadOnly returns the state at path without taking the writer's lock, so
// it is safe while a server has the state open: a concurrent compaction
// makes it read again, and a torn or still-being-written tail is ignored.
// It may include records that are written but not yet acknowledged. When
// no state exists the error matches fs.ErrNotExist.
func ReadOnly(path string) (map[string][]byte, error) {
	p := pathsFor(path)
	const attempts = 50
	var lastErr error
	for attempt := range attempts {
		if attempt > 0 {
			time.Sleep(time.Duration(attempt) * time.Millisecond)
		}
		o, err := openAll(p)
		if err != nil {
			return nil, fmt.Errorf("read state %s: %w", path, err)
		}
		ld, err := load(p, o)
		same, serr := o.unchanged(p)
		o.close()
		switch {
		case serr != nil:
			return nil, fmt.Errorf("read state %s: %w", path, serr)
		case !same:
			lastErr = errors.New("files were replaced while reading")
			continue
		case errors.Is(err, errNoState):
			return nil, fmt.Errorf("read state %s: %w", path, fs.ErrNotExist)
		case errors.Is(err, ErrCorrupt) && attempt < 3:
			// A writer's Open truncates a torn tail in place; give it a
			// moment before believing the damage.
			lastErr = err
			continue
		case err != nil:
			return nil, fmt.Errorf("read state %s: %w", path, err)
		}
		return ld.state, nil
	}
	return nil, fmt.Errorf("read state %s: gave up after %d attempts: %w", path, attempts, lastErr)
}

// syncDir makes renames and creations in dir durable.
func syncDir(dir string, noSync bool) error {
	if noSync {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}

func syncFile(f *os.File, noSync bool) error {
	if noSync {
		return nil
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", f.Name(), err)
	}
	return nil
}

// writeSnapshot durably replaces path with a snapshot of state at gen and
// returns its size.
func writeSnapshot(path string, gen uint64, state map[string][]byte, noSync bool) (size int64, err error) {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, fmt.Errorf("create %s: %w", tmp, err)
	}
	defer func() {
		if f != nil {
			f.Close()
		}
		if err != nil {
			os.Remove(tmp)
		}
	}()
	buf := fileHeader{kind: kindSnapshot, gen: gen, count: uint64(len(state))}.encode()
	frame := make([]byte, frameHeaderSize, snapshotChunk+4096)
	size = int64(len(buf))
	flush := func() error {
		if len(frame) == frameHeaderSize {
			return nil
		}
		putFrameHeader(frame)
		buf = append(buf, frame...)
		size += int64(len(frame))
		frame = frame[:frameHeaderSize]
		if len(buf) >= 1<<20 {
			if _, err := f.Write(buf); err != nil {
				return fmt.Errorf("write %s: %w", tmp, err)
			}
			buf = buf[:0]
		}
		return nil
	}
	for k, v := range state {
		frame = appendBytes(frame, k)
		frame = appendBytes(frame, v)
		if len(frame) >= snapshotChunk {
			if err := flush(); err != nil {
				return 0, err
			}
		}
	}
	if err := flush(); err != nil {
		return 0, err
	}
	if _, err := f.Write(buf); err != nil {
		return 0, fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := syncFile(f, noSync); err != nil {
		return 0, err
	}
	if err := f.Close(); err != nil {
		return 0, fmt.Errorf("close %s: %w", tmp, err)
	}
	f = nil
	hook("snapshot-written")
	if err := os.Rename(tmp, path); err != nil {
		return 0, fmt.Errorf("rename %s: %w", tmp, err)
	}
	return size, syncDir(filepath.Dir(path), noSync)
}

// createJournal durably replaces path with an empty journal of gen and
// returns it open for appending.
func createJournal(path string, gen uint64, noSync bool) (*os.File, error) {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", tmp, err)
	}
	err = func() error {
		if _, err := f.Write(fileHeader{kind: kindJournal, gen: gen}.encode()); err != nil {
			return fmt.Errorf("write %s: %w", tmp, err)
		}
		if err := syncFile(f, noSync); err != nil {
			return err
		}
		if err := os.Rename(tmp, path); err != nil {
			return fmt.Errorf("rename %s: %w", tmp, err)
		}
		return syncDir(filepath.Dir(path), noSync)
	}()
	if err != nil {
		f.Close()
		os.Remove(tmp)
		return nil, err
	}
	return f, nil
}

// testHook, set only by tests, is called at named points of compaction and
// recovery so a test can copy the files exactly as a crash there would
// leave them.
var testHook func(step string)

func hook(step string) {
	if testHook != nil {
		testHook(step)
	}
}
