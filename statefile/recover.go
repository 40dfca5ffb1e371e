package statefile

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/bigfleet-vm/provider/conffile"
	"github.com/bigfleet-vm/provider/retry"
)

// paths names the files of one state; see doc.go.
type paths struct {
	base, dir, snap, journal, next, lock, probe, mark string
}

func pathsFor(p string) paths {
	return paths{
		base:    p,
		dir:     filepath.Dir(p),
		snap:    p + ".snap",
		journal: p + ".journal",
		next:    p + ".journal.next",
		lock:    p + ".lock",
		probe:   p + ".probe.tmp",
		mark:    p + ".mark",
	}
}

func (p paths) temps() []string {
	return []string{p.snap + ".tmp", p.journal + ".tmp", p.next + ".tmp", p.probe, p.mark + ".tmp"}
}

// CheckPath says why path cannot name a state, nil if it can: it must be
// a file path (not a directory, not ending in a separator), spelled
// without surrounding blanks, control characters or a leading '-' (which
// would read as standard input or a flag), and not a device or other
// special file: if it exists it is a regular file, and its directory is
// a directory outside the kernel's pseudo file systems (/dev, /proc,
// /sys), where the state's files could not live. Open and ReadOnly call
// it; configuration calls it to report a bad --state at startup.
func CheckPath(path string) error {
	switch {
	case path == "":
		return errors.New("empty path")
	case strings.TrimSpace(path) == "":
		return errors.New("the path is blank")
	case strings.TrimSpace(path) != path:
		return errors.New("the path starts or ends with white space; quote it correctly")
	case strings.IndexFunc(path, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0:
		return errors.New("the path holds a control character")
	case path[0] == '-':
		return errors.New("the path starts with '-', which reads as standard input or a flag; write ./" + path + " for a file of that name")
	case strings.HasSuffix(path, "/") || strings.HasSuffix(path, string(filepath.Separator)):
		return errors.New("the path ends in a separator; name a file, not a directory")
	}
	if st, err := os.Stat(path); err == nil {
		switch {
		case st.IsDir():
			return errors.New("the path is a directory; name a file inside it, e.g. " + filepath.Join(path, "state"))
		case !st.Mode().IsRegular():
			return fmt.Errorf("the path is %s, not a regular file; the state needs files of its own next to it", conffile.Kind(st.Mode()))
		}
	}
	dir := filepath.Dir(path)
	st, err := os.Stat(dir)
	if err != nil {
		return nil // Open creates it, or reports why it cannot
	}
	if !st.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	for _, pseudo := range []string{"/dev", "/proc", "/sys"} {
		if p, err := os.Stat(pseudo); err == nil && sameDevice(st, p) {
			return fmt.Errorf("%s is on the kernel's %s file system, where a state's files cannot live", dir, pseudo)
		}
	}
	return nil
}

// sameDevice reports whether two files live on one mounted file system.
func sameDevice(a, b fs.FileInfo) bool {
	as, ok1 := a.Sys().(*syscall.Stat_t)
	bs, ok2 := b.Sys().(*syscall.Stat_t)
	return ok1 && ok2 && as.Dev == bs.Dev
}

// errNoState means no state exists yet: none of the files, or only the
// empty journal a crashed creation of a new state left.
var errNoState = errors.New("no state")

// openFiles holds descriptors for the files that existed when they were
// opened; nil means absent.
type openFiles struct {
	mark, snap, journal, next *os.File
}

// openAll opens the files in the order they may be read: the mark first,
// since the journal only grows past what it records, so a journal read
// after it is never shorter than its promise.
func openAll(p paths) (openFiles, error) {
	var o openFiles
	for _, s := range []struct {
		path string
		f    **os.File
	}{{p.mark, &o.mark}, {p.snap, &o.snap}, {p.journal, &o.journal}, {p.next, &o.next}} {
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
	for _, f := range []*os.File{o.mark, o.snap, o.journal, o.next} {
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
	}{{p.mark, o.mark}, {p.snap, o.snap}, {p.journal, o.journal}, {p.next, o.next}} {
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
	sealed  bool   // ends with a seal frame naming generation gen+1
	tear    string // why the tail was judged torn
	lastSum uint32 // payload checksum of the frame that ends at end
	// damage, when set, is why replay stopped at end although what
	// follows was, or may have been, acknowledged: a *CorruptError that
	// only Open with Recover gets past.
	damage *CorruptError
}

// loaded is what the files of a state say.
type loaded struct {
	state    map[string][]byte
	version  uint16 // the snapshot's format; legacyVersion means Open must upgrade
	snapGen  uint64
	snapSize int64
	chain    []journalInfo // replayed, oldest first
	stale    []string      // journals older than the snapshot, ignored
	// rotation is the state at the end of chain[0] when the chain has two
	// journals and load was asked to keep it: the content of the snapshot
	// that an interrupted compaction did not install.
	rotation map[string][]byte
	// Format 1 only: the highest generation of any file present, and
	// whether the chain replays a journal at P.journal.next.
	maxGen   uint64
	liveNext bool
	// upgrading is set for a format-2 snapshot that an interrupted upgrade
	// left beside format-1 journals; chain is then empty or holds only the
	// upgrade's empty journal.
	upgrading bool
	// mark is the mark file's newest record, nil without one (a state of
	// an earlier release) or, with Recover, when it is unreadable.
	mark *mark
	// markErr says why a mark the state should have cannot be used, and
	// markTrouble is its text once Recover goes ahead without it.
	markErr     *CorruptError
	markTrouble string
	// With Recover: the first damage found (replay stopped there) and the
	// journals after it, which were not replayed.
	damage  *CorruptError
	dropped []journalFile
}

// records is how many records the chain replayed.
func (ld *loaded) records() int {
	n := 0
	for _, c := range ld.chain {
		n += c.records
	}
	return n
}

// sized is an open file and its length, taken once.
type sized struct {
	path string
	f    *os.File
	size int64
}

// journalFile is a journal that exists, and its header.
type journalFile struct {
	sized
	h fileHeader
}

func statSize(path string, f *os.File) (int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return st.Size(), nil
}

// load replays the snapshot and the journals that continue it, and checks
// every promise one file makes about another (see doc.go): the snapshot
// promises its generation's journal and a durable length of it, a sealed
// journal promises the next generation's, and records in the next
// generation's journal promise a seal before them. A format-1 snapshot is
// read by loadLegacy.
// loadOptions say what load may do beyond reading.
type loadOptions struct {
	// keepRotation keeps the state at the end of the first of two
	// journals (see loaded.rotation).
	keepRotation bool
	// recover makes damage to acknowledged records (see
	// journalInfo.damage) end the replay instead of failing it: the
	// loaded state is what precedes the first damage.
	recover bool
}

func load(p paths, o openFiles, opts loadOptions) (*loaded, error) {
	keepRotation := opts.keepRotation
	// The mark is read first: the journal only grows past what it
	// records, so lengths taken after it are never short of it.
	var mk *mark
	var markErr error
	if o.mark != nil {
		m, err := readMark(p.mark, o.mark)
		if err == nil {
			mk = &m
		}
		markErr = err
	}
	// Lengths are taken next before journal: a record reaches the next
	// journal only after the old one's seal is durable, so a reader that
	// sees such a record also sees the seal.
	var next, journal *sized
	for _, s := range []struct {
		path string
		f    *os.File
		dst  **sized
	}{{p.next, o.next, &next}, {p.journal, o.journal, &journal}} {
		if s.f == nil {
			continue
		}
		n, err := statSize(s.path, s.f)
		if err != nil {
			return nil, err
		}
		*s.dst = &sized{s.path, s.f, n}
	}
	if o.snap == nil {
		if next != nil {
			return nil, corrupt(p.snap, 0, "the snapshot is missing, but journal %s exists", p.next)
		}
		if journal != nil {
			if fresh, err := isJournalStart(journal, 1); err != nil || !fresh {
				return nil, errors.Join(err, corrupt(p.snap, 0, "the snapshot is missing, but journal %s exists", p.journal))
			}
		}
		return nil, errNoState
	}
	ld := &loaded{state: make(map[string][]byte)}
	h, size, promise, err := readSnapshot(p.snap, o.snap, ld.state)
	if err != nil {
		return nil, err
	}
	ld.version, ld.snapGen, ld.snapSize = h.version, h.gen, size
	var markCorrupt *CorruptError
	switch {
	case o.mark != nil && markErr == nil:
		ld.mark = mk
	case o.mark != nil && errors.As(markErr, &markCorrupt):
		// Reported once nothing worse is found (see done).
		markCorrupt.Recoverable = true
		ld.markErr = markCorrupt
	case o.mark != nil:
		return nil, markErr
	}
	var journals []journalFile // P.journal first
	for _, s := range []*sized{journal, next} {
		if s == nil {
			continue
		}
		h, err := readHeader(s.path, s.f, s.size, kindJournal)
		if err != nil {
			return nil, err
		}
		journals = append(journals, journalFile{*s, h})
	}
	if ld.version == legacyVersion {
		return loadLegacy(p, ld, journals)
	}

	type candidate struct {
		sized
		gen uint64
	}
	var chain []candidate
	var legacy []journalFile
	for _, j := range journals {
		switch {
		case j.h.version == legacyVersion && j.h.gen >= ld.snapGen:
			return nil, corrupt(j.path, 12, "format %d journal of generation %d beside format %d snapshot %s of generation %d: not a state an upgrade leaves",
				legacyVersion, j.h.gen, formatVersion, p.snap, ld.snapGen)
		case j.h.version == legacyVersion:
			legacy = append(legacy, j)
		case j.h.gen < ld.snapGen:
			ld.stale = append(ld.stale, j.path)
		case j.h.gen > ld.snapGen+1:
			return nil, corrupt(j.path, 12, "journal generation %d is ahead of snapshot %s generation %d", j.h.gen, p.snap, ld.snapGen)
		default:
			chain = append(chain, candidate{j.sized, j.h.gen})
		}
	}
	if len(legacy) > 0 {
		// Only an upgrade interrupted after its snapshot leaves format-1
		// journals beside a format-2 snapshot, and in one of two shapes
		// (see doc.go). Its snapshot holds the whole state.
		empty := int64(len(journalStart(ld.snapGen)))
		jv, nv := journalVersions(p, journals)
		switch {
		case promise != empty:
			return nil, corrupt(p.snap, headerSize, "the snapshot records %d bytes of its journal beside format %d journal %s, but an upgrade's snapshot records an empty journal (%d bytes)",
				promise, legacyVersion, legacy[0].path, empty)
		case nv == legacyVersion && jv != formatVersion:
			// The upgrade's snapshot is installed; its journal is not.
		case jv == legacyVersion && nv == formatVersion && len(chain) == 1 && chain[0].path == p.next && chain[0].size == empty:
			// The upgrade's journal waits to be renamed over the format-1 one.
		default:
			return nil, corrupt(legacy[0].path, 8, "format %d journal beside format %d snapshot %s and journals %s: not a state an upgrade leaves",
				legacyVersion, formatVersion, p.snap, describeVersions(jv, nv))
		}
		ld.upgrading = true
		for _, j := range legacy {
			ld.stale = append(ld.stale, j.path)
		}
	}
	if o.mark == nil && ld.version >= snapshotVersion {
		ld.markErr = corrupt(p.mark, 0, "the mark file is missing, but snapshot %s (format %d) promises one: nothing tells whether the journal lost acknowledged records", p.snap, ld.version)
		ld.markErr.Recoverable = true
	}
	if ld.upgrading && len(chain) == 0 {
		return ld.done(opts)
	}
	slices.SortFunc(chain, func(a, b candidate) int { return cmp.Compare(a.gen, b.gen) })
	switch {
	case len(chain) == 2 && chain[0].gen == chain[1].gen:
		return nil, corrupt(chain[1].path, 12, "journal generation %d duplicates %s", chain[1].gen, chain[0].path)
	case len(chain) == 2 && chain[0].path != p.journal:
		return nil, corrupt(p.next, 12, "journal generation %d is older than %s generation %d", chain[0].gen, p.journal, chain[1].gen)
	case len(chain) == 0:
		return ld.damaged(opts, corrupt(p.journal, 0, "the journal of generation %d is missing, but snapshot %s records %d durable bytes of it", ld.snapGen, p.snap, promise))
	case chain[0].gen != ld.snapGen:
		for _, c := range chain {
			ld.dropped = append(ld.dropped, journalFile{sized: c.sized, h: fileHeader{version: formatVersion, kind: kindJournal, gen: c.gen}})
		}
		return ld.damaged(opts, corrupt(p.journal, 0, "the journal of generation %d is missing (%s continues it with generation %d), but snapshot %s records %d durable bytes of it",
			ld.snapGen, chain[0].path, chain[0].gen, p.snap, promise))
	}
	if m := ld.mark; m != nil && m.gen > chain[len(chain)-1].gen {
		missing := p.journal
		if m.gen == ld.snapGen+1 {
			missing = p.next
		}
		return ld.damaged(opts, corrupt(missing, 0, "the journal of generation %d is missing, but mark %s records %d acknowledged bytes of it", m.gen, p.mark, m.length))
	}
	for i, c := range chain {
		var pr promised
		if i == 0 {
			pr = promised{promise, p.snap}
		}
		info, err := replayJournal(c.path, c.f, c.size, c.gen, ld.state, pr, ld.ackFor(c.gen, p.mark))
		if err != nil {
			return nil, err
		}
		ld.chain = append(ld.chain, info)
		if info.damage != nil {
			for _, later := range chain[i+1:] {
				ld.dropped = append(ld.dropped, journalFile{sized: later.sized, h: fileHeader{version: formatVersion, kind: kindJournal, gen: later.gen}})
			}
			return ld.damaged(opts, info.damage)
		}
		if i == 0 && len(chain) == 2 && keepRotation {
			ld.rotation = maps.Clone(ld.state)
		}
	}
	last := ld.chain[len(ld.chain)-1]
	if last.sealed {
		return ld.damaged(opts, corrupt(p.next, 0, "the journal of generation %d is missing, but %s was sealed to continue in it", last.gen+1, last.path))
	}
	if len(ld.chain) == 2 && ld.chain[1].records > 0 {
		// The seal was durable before any record went to the next journal.
		switch c := ld.chain[0]; {
		case c.tear != "":
			return nil, corrupt(c.path, c.end, "%s, but %s holds records written after this journal was complete", c.tear, ld.chain[1].path)
		case !c.sealed:
			return nil, corrupt(c.path, c.end, "the journal ends unsealed, but %s holds records that follow its seal: it was truncated", ld.chain[1].path)
		}
	}
	return ld.done(opts)
}

// done returns ld once it was read whole, unless its mark is missing or
// unreadable: then, without opts.recover, the mark's *CorruptError (it
// comes last, so worse damage, which Recover cannot drop, is reported
// first).
func (ld *loaded) done(opts loadOptions) (*loaded, error) {
	if ld.markErr == nil {
		return ld, nil
	}
	if !opts.recover {
		return nil, ld.markErr
	}
	ld.markTrouble = ld.markErr.Error()
	return ld, nil
}

// damaged returns ld with its replay cut at err when opts allow a
// recovery, and err otherwise.
func (ld *loaded) damaged(opts loadOptions, err *CorruptError) (*loaded, error) {
	err.Recoverable = true
	if !opts.recover {
		return nil, err
	}
	ld.damage = err
	if ld.markErr != nil {
		ld.markTrouble = ld.markErr.Error()
	}
	return ld, nil
}

// ackFor is what the mark says about the journal of gen, whose path is
// named in errors by markPath.
func (ld *loaded) ackFor(gen uint64, markPath string) acked {
	switch m := ld.mark; {
	case m == nil && ld.version >= snapshotVersion:
		// The mark is missing or unreadable (Recover): nothing is known,
		// so judge like a state of an earlier release.
		return acked{strict: true}
	case m == nil:
		return acked{strict: true}
	case m.gen == gen:
		return acked{length: m.length, sum: m.sum, records: m.records, set: true, by: markPath}
	case m.gen > gen:
		// A journal older than the mark's was complete (sealed) before
		// anything was written to the mark's.
		return acked{whole: true, by: markPath}
	}
	// Nothing of this journal has been acknowledged yet.
	return acked{}
}

// acked is what the mark says about one journal.
type acked struct {
	// set: the journal was acknowledged up to length, where a frame with
	// payload checksum sum ends, holding records records in all.
	set     bool
	length  int64
	sum     uint32
	records uint64
	// whole: every frame of the journal was acknowledged (it is older
	// than the mark's).
	whole bool
	// strict: no mark exists, so a complete final frame that fails its
	// checksum may have been acknowledged: it is damage, not a torn write.
	strict bool
	by     string // the mark's path
}

// journalVersions returns the format versions of P.journal and
// P.journal.next, 0 for absent.
func journalVersions(p paths, journals []journalFile) (journal, next uint16) {
	for _, j := range journals {
		if j.path == p.journal {
			journal = j.h.version
		} else {
			next = j.h.version
		}
	}
	return journal, next
}

func describeVersions(journal, next uint16) string {
	name := func(v uint16) string {
		if v == 0 {
			return "absent"
		}
		return fmt.Sprintf("format %d", v)
	}
	return fmt.Sprintf("(journal %s, next %s)", name(journal), name(next))
}

// maxLegacyGeneration bounds the generations of a format-1 state, so that
// the upgrade's generation and every later one fit. Format 1 added one
// per compaction; anything near the bound is damage.
const maxLegacyGeneration = 1 << 62

// loadLegacy continues load for a format-1 snapshot (ld holds it): it
// replays the format-1 journals exactly as the previous release did, and
// accepts the one format-2 file an upgrade writes before its snapshot.
//
// Format 1 rules: journals older than the snapshot are stale; the others
// must be of its generation and, at most one, the next; only the last
// journal replayed may end in a torn frame; a snapshot without journals
// is the whole state.
func loadLegacy(p paths, ld *loaded, journals []journalFile) (*loaded, error) {
	ld.maxGen = ld.snapGen
	var chain []journalFile
	var upgrade *journalFile
	for _, j := range journals {
		if j.h.gen >= maxLegacyGeneration {
			return nil, corrupt(j.path, 12, "generation %d is implausible", j.h.gen)
		}
		if j.h.version == formatVersion {
			if j.path != p.next {
				return nil, corrupt(j.path, 8, "format %d journal beside format %d snapshot %s: not a state an upgrade leaves", formatVersion, legacyVersion, p.snap)
			}
			upgrade = &j
			continue
		}
		ld.maxGen = max(ld.maxGen, j.h.gen)
		switch {
		case j.h.gen < ld.snapGen:
			ld.stale = append(ld.stale, j.path)
		case j.h.gen > ld.snapGen+1:
			return nil, corrupt(j.path, 12, "journal generation %d is ahead of snapshot %s generation %d", j.h.gen, p.snap, ld.snapGen)
		default:
			chain = append(chain, j)
		}
	}
	if ld.snapGen >= maxLegacyGeneration {
		return nil, corrupt(p.snap, 12, "generation %d is implausible", ld.snapGen)
	}
	if upgrade != nil {
		// The upgrade creates its journal, generation above every format-1
		// file, before it replaces anything.
		fresh, err := isJournalStart(&upgrade.sized, upgrade.h.gen)
		switch {
		case err != nil:
			return nil, err
		case upgrade.h.gen <= ld.maxGen:
			return nil, corrupt(upgrade.path, 12, "format %d journal of generation %d beside format %d files of generation %d: not a state an upgrade leaves",
				formatVersion, upgrade.h.gen, legacyVersion, ld.maxGen)
		case !fresh:
			return nil, corrupt(upgrade.path, headerSize, "format %d journal beside format %d snapshot %s holds more than its start frame: not a state an upgrade leaves",
				formatVersion, legacyVersion, p.snap)
		}
		ld.maxGen = upgrade.h.gen
		ld.stale = append(ld.stale, upgrade.path)
	}
	slices.SortFunc(chain, func(a, b journalFile) int { return cmp.Compare(a.h.gen, b.h.gen) })
	switch {
	case len(chain) == 2 && chain[0].h.gen == chain[1].h.gen:
		return nil, corrupt(chain[1].path, 12, "journal generation %d duplicates %s", chain[1].h.gen, chain[0].path)
	case len(chain) > 0 && chain[0].h.gen != ld.snapGen:
		return nil, corrupt(chain[0].path, 12, "journal generation %d continues generation %d, but no journal of generation %d exists", chain[0].h.gen, ld.snapGen, ld.snapGen)
	}
	for i, c := range chain {
		info, err := replayLegacyJournal(c.path, c.f, c.size, c.h.gen, ld.state, i == len(chain)-1)
		if err != nil {
			return nil, err
		}
		ld.chain = append(ld.chain, info)
		ld.liveNext = ld.liveNext || c.path == p.next
	}
	return ld, nil
}

// isJournalStart reports whether s holds exactly an empty journal of gen:
// its header and start frame.
func isJournalStart(s *sized, gen uint64) (bool, error) {
	want := journalStart(gen)
	if s.size != int64(len(want)) {
		return false, nil
	}
	b := make([]byte, len(want))
	if _, err := s.f.ReadAt(b, 0); err != nil {
		return false, fmt.Errorf("read %s: %w", s.path, err)
	}
	return bytes.Equal(b, want), nil
}

func readHeader(path string, f io.ReaderAt, size int64, kind byte) (fileHeader, error) {
	b := make([]byte, min(size, headerSize))
	if _, err := f.ReadAt(b, 0); err != nil {
		return fileHeader{}, fmt.Errorf("read %s: %w", path, err)
	}
	return decodeHeader(path, b, kind)
}

// readSnapshot loads a snapshot into state and returns its header, length
// and the journal length it promises (-1 for format 1, which promises
// none). A snapshot is complete before it is renamed into place, so every
// fault is corruption.
func readSnapshot(path string, f *os.File, state map[string][]byte) (fileHeader, int64, int64, error) {
	size, err := statSize(path, f)
	if err != nil {
		return fileHeader{}, 0, 0, err
	}
	h, err := readHeader(path, f, size, kindSnapshot)
	if err != nil {
		return fileHeader{}, 0, 0, err
	}
	promise, err := readSnapshotFrames(path, f, size, h, state)
	return h, size, promise, err
}

func readSnapshotFrames(path string, f io.ReaderAt, size int64, h fileHeader, state map[string][]byte) (int64, error) {
	fr := newFrameReader(path, f, size)
	var entries uint64
	promise := int64(-1)
	for {
		at := fr.off
		payload, fault, err := fr.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, err
		}
		if fault != nil {
			return 0, corrupt(path, fault.off, "%s", fault.reason)
		}
		if promise < 0 && h.version != legacyVersion {
			if promise, err = parseMeta(payload); err != nil {
				return 0, corrupt(path, at, "%v", err)
			}
			if least := int64(len(journalStart(h.gen))); promise < least {
				return 0, corrupt(path, at, "records a journal of %d bytes, less than the %d of an empty one", promise, least)
			}
			continue
		}
		n, err := applySnapshotPayload(payload, state)
		if err != nil {
			return 0, corrupt(path, at, "%v", err)
		}
		entries += uint64(n)
	}
	if promise < 0 && h.version != legacyVersion {
		return 0, corrupt(path, headerSize, "the snapshot has no meta frame")
	}
	if entries != h.count {
		return 0, corrupt(path, size, "snapshot holds %d entries, header says %d", entries, h.count)
	}
	return promise, nil
}

// promised is what a snapshot says about its generation's journal: at
// least min bytes of it were durable when the snapshot was installed.
type promised struct {
	min int64
	by  string // the snapshot's path
}

// replayJournal applies a journal's frames to state. A fault that an
// interrupted final write explains ends the replay (the caller decides
// whether a torn tail is allowed there). Damage to what was acknowledged
// (within the promised or acknowledged length, a complete final frame
// that fails its checksum where no mark tells, anything before a whole
// frame) also ends it, with info.damage saying why, and so does a journal
// that ends before the acknowledged length or holds another frame there;
// only a broken start frame and I/O errors fail it.
func replayJournal(path string, f io.ReaderAt, size int64, gen uint64, state map[string][]byte, pr promised, ack acked) (journalInfo, error) {
	info := journalInfo{path: path, gen: gen, size: size}
	fr := newFrameReader(path, f, size)
	first, ackSeen := true, false
	damage := func(off int64, format string, a ...any) {
		if info.damage == nil {
			info.damage = corrupt(path, off, format, a...)
		}
	}
	if size < pr.min {
		// Known before reading: replay what is left, for a recovery.
		damage(size, "the journal ends at %d bytes, but snapshot %s records %d bytes of it as durable: it was truncated", size, pr.by, pr.min)
	}
	info.end = min(size, headerSize)
frames:
	for {
		at := fr.off
		payload, fault, err := fr.next()
		if errors.Is(err, io.EOF) {
			if first && info.damage == nil {
				return journalInfo{}, corrupt(path, at, "the journal has no start frame: it was truncated to its header")
			}
			break
		}
		if err != nil {
			return journalInfo{}, err
		}
		if fault != nil {
			switch {
			case first && info.damage != nil:
			case first:
				// The start frame was fsynced before the journal was renamed
				// into place: it cannot be torn.
				return journalInfo{}, corrupt(path, fault.off, "start frame: %s", fault.reason)
			case ack.whole:
				damage(fault.off, "%s in a journal that was complete before mark %s moved to the next generation", fault.reason, ack.by)
			case ack.set && fault.off < ack.length:
				damage(fault.off, "%s within the %d bytes mark %s records as acknowledged", fault.reason, ack.length, ack.by)
			case fault.off < pr.min:
				damage(fault.off, "%s within the %d bytes snapshot %s records as durable", fault.reason, pr.min, pr.by)
			case !fault.mayBeTorn:
				damage(fault.off, "%s", fault.reason)
			case ack.strict && fault.complete:
				damage(fault.off, "%s in the complete final frame: without a mark nothing says it was never acknowledged, so it is damage, not a torn write", fault.reason)
			default:
				info.tear = fault.reason
			}
			break frames
		}
		c, isControl, err := parseControl(payload)
		switch {
		case err != nil:
			damage(at, "%v", err)
			break frames
		case info.sealed:
			damage(at, "a frame follows the seal")
			break frames
		case first && (!isControl || c.tag != ctlStart || c.gen != gen):
			return journalInfo{}, corrupt(path, at, "the first frame is not the start of generation %d", gen)
		case first:
		case isControl && c.tag == ctlSeal && c.gen == gen+1:
			info.sealed = true
		case isControl:
			damage(at, "unexpected control frame %q for generation %d in generation %d", c.tag, c.gen, gen)
			break frames
		default:
			// A record frame is applied whole or not at all.
			if _, err := applyJournalPayload(payload, nil); err != nil {
				damage(at, "%v", err)
				break frames
			}
			n, _ := applyJournalPayload(payload, state)
			info.records += n
		}
		first = false
		if ack.set && fr.off == ack.length {
			if fr.sum != ack.sum {
				damage(at, "the frame ending at %d is not the one mark %s records as acknowledged there (checksum %08x, want %08x)", ack.length, ack.by, fr.sum, ack.sum)
				break frames
			}
			ackSeen = true
		}
		info.end, info.lastSum = fr.off, fr.sum
	}
	switch {
	case info.damage != nil:
	case ack.set && info.end < ack.length:
		damage(info.end, "the journal holds %d whole bytes, but mark %s records %d bytes (%d records) of it as acknowledged: it was cut or damaged",
			info.end, ack.by, ack.length, ack.records)
	case ack.set && !ackSeen:
		damage(ack.length, "no frame ends at %d, where mark %s records the acknowledged end", ack.length, ack.by)
	}
	return info, nil
}

// replayLegacyJournal applies a format-1 journal's frames to state as the
// previous release did: every frame holds records, and with allowTorn a
// fault that an interrupted final write explains ends the replay instead
// of failing it.
func replayLegacyJournal(path string, f io.ReaderAt, size int64, gen uint64, state map[string][]byte, allowTorn bool) (journalInfo, error) {
	info := journalInfo{path: path, gen: gen, size: size}
	fr := newFrameReader(path, f, size)
	for {
		at := fr.off
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
		if len(payload) == 0 {
			// Format 1 never wrote an empty frame, and read one as no records.
			continue
		}
		n, err := applyJournalPayload(payload, state)
		if err != nil {
			return journalInfo{}, corrupt(path, at, "%v", err)
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
	if err := CheckPath(path); err != nil {
		return nil, fmt.Errorf("read state %q: %w", path, err)
	}
	p := pathsFor(path)
	policy := readOnlyPolicy
	attempt := 0
	state, err := retry.Value(context.Background(), policy, func(err error) bool {
		var again *readAgain
		return errors.As(err, &again)
	}, func(context.Context) (map[string][]byte, error) {
		attempt++
		o, err := openAll(p)
		if err != nil {
			return nil, fmt.Errorf("read state %s: %w", path, err)
		}
		ld, err := load(p, o, loadOptions{})
		same, serr := o.unchanged(p)
		o.close()
		switch {
		case serr != nil:
			return nil, fmt.Errorf("read state %s: %w", path, serr)
		case !same:
			return nil, &readAgain{errors.New("files were replaced while reading")}
		case errors.Is(err, errNoState):
			return nil, fmt.Errorf("read state %s: %w", path, fs.ErrNotExist)
		case errors.Is(err, ErrCorrupt) && attempt <= 3:
			// A writer's Open truncates a torn tail in place; give it a
			// moment before believing the damage.
			return nil, &readAgain{err}
		case err != nil:
			return nil, fmt.Errorf("read state %s: %w", path, err)
		}
		return ld.state, nil
	})
	if again := (*readAgain)(nil); errors.As(err, &again) {
		return nil, fmt.Errorf("read state %s: gave up after %d attempts: %w", path, attempt, again.err)
	}
	return state, err
}

// readAgain is a read of ReadOnly that another may get right.
type readAgain struct{ err error }

func (e *readAgain) Error() string { return e.err.Error() }

// readOnlyPolicy paces ReadOnly's reads (retry.StateRead; tests make it
// faster).
var readOnlyPolicy = retry.StateRead

// fileErr reports err from op on the file at path. A journal keeps its
// descriptor across renames, so the name it was opened under (which
// *fs.PathError carries) may no longer be the file's: it is dropped.
func fileErr(op, path string, err error) error {
	if pe, ok := errors.AsType[*fs.PathError](err); ok {
		err = pe.Err
	}
	return fmt.Errorf("%s %s: %w", op, path, err)
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
		return fileErr("fsync directory", dir, err)
	}
	return nil
}

// syncFile fsyncs f, which path names now.
func syncFile(f *os.File, path string, noSync bool) error {
	if noSync {
		return nil
	}
	if err := f.Sync(); err != nil {
		return fileErr("fsync", path, err)
	}
	return nil
}

// probeDir fails unless a file can be created, written, fsynced and
// removed next to the state, so an unwritable directory stops Open rather
// than the first compaction.
func probeDir(p paths, noSync bool) error {
	f, err := os.OpenFile(p.probe, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("state directory %s is not writable: %w", p.dir, err)
	}
	_, err = f.Write(make([]byte, headerSize))
	if err != nil {
		err = fileErr("write", p.probe, err)
	} else {
		err = syncFile(f, p.probe, noSync)
	}
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fileErr("close", p.probe, cerr)
	}
	if rerr := os.Remove(p.probe); err == nil && rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		err = rerr
	}
	if err == nil {
		err = syncDir(p.dir, noSync)
	}
	if err != nil {
		return fmt.Errorf("state directory %s is not writable: %w", p.dir, err)
	}
	return nil
}

// writeSnapshot durably replaces path with a snapshot of state at gen
// that promises journalMin durable bytes of gen's journal, and returns its
// size.
func writeSnapshot(path string, gen uint64, state map[string][]byte, journalMin int64, noSync bool) (size int64, err error) {
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
	buf = append(buf, frame(metaPayload(journalMin))...)
	chunk := make([]byte, frameHeaderSize, snapshotChunk+4096)
	size = int64(len(buf))
	flush := func() error {
		if len(chunk) == frameHeaderSize {
			return nil
		}
		putFrameHeader(chunk)
		buf = append(buf, chunk...)
		size += int64(len(chunk))
		chunk = chunk[:frameHeaderSize]
		if len(buf) >= 1<<20 {
			if _, err := f.Write(buf); err != nil {
				return fileErr("write", tmp, err)
			}
			buf = buf[:0]
		}
		return nil
	}
	for k, v := range state {
		chunk = appendBytes(chunk, k)
		chunk = appendBytes(chunk, v)
		if len(chunk) >= snapshotChunk {
			if err := flush(); err != nil {
				return 0, err
			}
		}
	}
	if err := flush(); err != nil {
		return 0, err
	}
	if _, err := f.Write(buf); err != nil {
		return 0, fileErr("write", tmp, err)
	}
	if err := syncFile(f, tmp, noSync); err != nil {
		return 0, err
	}
	if err := f.Close(); err != nil {
		return 0, fileErr("close", tmp, err)
	}
	f = nil
	hook("snapshot-written")
	if err := os.Rename(tmp, path); err != nil {
		return 0, fmt.Errorf("rename %s: %w", tmp, err)
	}
	return size, syncDir(filepath.Dir(path), noSync)
}

// createJournal durably replaces path with an empty journal of gen and
// returns it open for appending and locked, so that no second writer can
// use it even if the lock file is removed.
func createJournal(path string, gen uint64, noSync bool) (*os.File, error) {
	return replaceFile(path, journalStart(gen), true, noSync)
}

// replaceFile durably replaces path with a file holding content: written
// to path.tmp (locked first when lock), synced, renamed into place and
// the directory synced, so path is its old self or the new file, never a
// torn one. The new file is returned open (read-write); on error the .tmp
// is removed.
func replaceFile(path string, content []byte, lock, noSync bool) (*os.File, error) {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", tmp, err)
	}
	err = func() error {
		if lock {
			if err := lockFile(f); err != nil {
				return fmt.Errorf("lock %s: %w", tmp, err)
			}
		}
		if _, err := f.Write(content); err != nil {
			return fileErr("write", tmp, err)
		}
		if err := syncFile(f, tmp, noSync); err != nil {
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
