package statefile

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// On-disk format, version 2. See doc.go for the layout.
const (
	formatVersion = 2
	// snapshotVersion is the version of the snapshots this release
	// writes: format 2, and the state has a mark file (P.mark) that the
	// snapshot promises. A format-2 snapshot (the previous release's)
	// promises none; Open then creates the mark and compacts, so the next
	// snapshot makes the promise. Journals stay at formatVersion.
	snapshotVersion = 3
	// legacyVersion is the format the release before wrote: the same
	// header and frame encoding, without start, seal or meta frames. It is
	// read, and Open upgrades it; nothing writes it.
	legacyVersion = 1

	headerSize      = 32
	frameHeaderSize = 12

	kindSnapshot byte = 'S'
	kindJournal  byte = 'J'

	opPut    byte = 1
	opDelete byte = 2

	// A journal frame whose payload starts with a zero op count is a
	// control frame: one of these tags and a uvarint generation.
	ctlStart byte = 'S' // first frame of every journal: its own generation
	ctlSeal  byte = 'E' // last frame of a journal a compaction left: the next generation

	// metaTag starts the first frame of every snapshot, followed by the
	// uvarint length of its generation's journal that was durable when
	// the snapshot was installed.
	metaTag byte = 'M'

	// maxFrame bounds a frame's payload; a larger length is corruption.
	maxFrame = 1 << 30
	// maxRecord bounds one Apply call's encoded size; Apply rejects more.
	maxRecord = 256 << 20
	// batchLimit is the size at which Apply starts a new group commit
	// frame instead of growing the queued one.
	batchLimit = 8 << 20
	// snapshotChunk is the payload size at which a snapshot frame is cut.
	snapshotChunk = 64 << 10
)

var (
	magic      = [8]byte{'B', 'F', 'S', 'T', 'A', 'T', 'E', 0}
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
)

// ErrCorrupt is matched (errors.Is) by every *CorruptError.
var ErrCorrupt = errors.New("state file is corrupt")

// CorruptError reports damage that recovery must not paper over.
type CorruptError struct {
	Path   string
	Offset int64
	Reason string
	// Recoverable is set for damage to the journal (or a missing or
	// unreadable journal or mark) that Open with Options.Recover can drop,
	// rebuilding the state from what precedes it; damage to the snapshot
	// or the structure of the files is not.
	Recoverable bool
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("state file %s is corrupt at offset %d: %s", e.Path, e.Offset, e.Reason)
}

// Unwrap lets errors.Is(err, ErrCorrupt) match.
func (e *CorruptError) Unwrap() error { return ErrCorrupt }

func corrupt(path string, off int64, format string, args ...any) *CorruptError {
	return &CorruptError{Path: path, Offset: off, Reason: fmt.Sprintf(format, args...)}
}

// fileHeader is the first headerSize bytes of every file.
type fileHeader struct {
	version uint16 // encode writes the kind's current version when zero
	kind    byte
	gen     uint64
	count   uint64 // snapshot: number of entries; journal: 0
}

func (h fileHeader) encode() []byte {
	b := make([]byte, headerSize)
	copy(b, magic[:])
	v := uint16(formatVersion)
	switch {
	case h.version != 0:
		v = h.version // tests write the files of earlier releases
	case h.kind == kindSnapshot:
		v = snapshotVersion
	}
	binary.LittleEndian.PutUint16(b[8:], v)
	b[10] = h.kind
	binary.LittleEndian.PutUint64(b[12:], h.gen)
	binary.LittleEndian.PutUint64(b[20:], h.count)
	binary.LittleEndian.PutUint32(b[28:], crc32.Checksum(b[:28], castagnoli))
	return b
}

func decodeHeader(path string, b []byte, want byte) (fileHeader, error) {
	if len(b) < headerSize {
		return fileHeader{}, corrupt(path, int64(len(b)), "file is shorter than its %d-byte header", headerSize)
	}
	if !bytes.Equal(b[:8], magic[:]) {
		return fileHeader{}, corrupt(path, 0, "bad magic %q: not a statefile", b[:8])
	}
	if got := binary.LittleEndian.Uint32(b[28:]); got != crc32.Checksum(b[:28], castagnoli) {
		return fileHeader{}, corrupt(path, 28, "header checksum mismatch")
	}
	v := binary.LittleEndian.Uint16(b[8:])
	h := fileHeader{version: v, kind: b[10], gen: binary.LittleEndian.Uint64(b[12:]), count: binary.LittleEndian.Uint64(b[20:])}
	if h.kind != want {
		return fileHeader{}, corrupt(path, 10, "file kind %q, want %q", h.kind, want)
	}
	newest := uint16(formatVersion)
	if want == kindSnapshot {
		newest = snapshotVersion
	}
	if v < legacyVersion || v > newest {
		return fileHeader{}, corrupt(path, 8, "unsupported format version %d (this build reads versions %d to %d)", v, legacyVersion, newest)
	}
	if h.gen == 0 {
		return fileHeader{}, corrupt(path, 12, "generation 0")
	}
	return h, nil
}

// putFrameHeader fills b[:frameHeaderSize] for the payload b[frameHeaderSize:].
func putFrameHeader(b []byte) {
	payload := b[frameHeaderSize:]
	binary.LittleEndian.PutUint32(b[0:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(b[4:], crc32.Checksum(payload, castagnoli))
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b[:8], castagnoli))
}

// frameHeaderOK reports whether h (frameHeaderSize bytes) is intact, and
// the payload length and checksum it declares.
func frameHeaderOK(h []byte) (n uint32, sum uint32, ok bool) {
	if crc32.Checksum(h[:8], castagnoli) != binary.LittleEndian.Uint32(h[8:]) {
		return 0, 0, false
	}
	return binary.LittleEndian.Uint32(h[0:]), binary.LittleEndian.Uint32(h[4:]), true
}

// recordSize is the encoded size of one Apply call.
func recordSize(ops []Op) int {
	n := binary.MaxVarintLen64
	for _, op := range ops {
		n += 1 + 2*binary.MaxVarintLen64 + len(op.Key)
		if !op.Delete {
			n += len(op.Value)
		}
	}
	return n
}

// appendRecord encodes one Apply call: op count, then per op a tag, the
// key and, for puts, the value.
func appendRecord(b []byte, ops []Op) []byte {
	b = binary.AppendUvarint(b, uint64(len(ops)))
	for _, op := range ops {
		if op.Delete {
			b = append(b, opDelete)
			b = appendBytes(b, op.Key)
			continue
		}
		b = append(b, opPut)
		b = appendBytes(b, op.Key)
		b = appendBytes(b, op.Value)
	}
	return b
}

func appendBytes[T string | []byte](b []byte, s T) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decoder walks a checksummed payload; any malformation is corruption
// because the checksum already proved the bytes are what was written.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errors.New("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.err = errors.New("payload ends inside a record")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = fmt.Errorf("length %d exceeds the %d bytes left in the frame", n, len(d.b))
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

// cloneValue copies v into a non-nil slice, so that an empty value reads
// back the same way whether it came from Apply or from disk.
func cloneValue(v []byte) []byte {
	c := make([]byte, len(v))
	copy(c, v)
	return c
}

// frame returns payload framed: a frame header followed by payload.
func frame(payload []byte) []byte {
	b := make([]byte, frameHeaderSize, frameHeaderSize+len(payload))
	b = append(b, payload...)
	putFrameHeader(b)
	return b
}

// controlFrame is a whole journal control frame: tag and generation.
func controlFrame(tag byte, gen uint64) []byte {
	return frame(binary.AppendUvarint([]byte{0, tag}, gen))
}

// journalStart is the header and start frame every journal of gen begins
// with; its length is the least a journal of gen can hold.
func journalStart(gen uint64) []byte {
	return append(fileHeader{kind: kindJournal, gen: gen}.encode(), controlFrame(ctlStart, gen)...)
}

// control is a decoded control frame.
type control struct {
	tag byte
	gen uint64
}

// parseControl reports whether a journal frame's payload is a control
// frame and decodes it. Record frames start with a non-zero op count.
func parseControl(payload []byte) (control, bool, error) {
	if len(payload) == 0 || payload[0] != 0 {
		return control{}, false, nil
	}
	d := decoder{b: payload[1:]}
	c := control{tag: d.byte(), gen: d.uvarint()}
	switch {
	case d.err != nil:
	case c.tag != ctlStart && c.tag != ctlSeal:
		d.err = fmt.Errorf("unknown control tag %d", c.tag)
	case len(d.b) > 0:
		d.err = fmt.Errorf("%d stray bytes after a control record", len(d.b))
	}
	return c, true, d.err
}

// metaPayload is the first frame of a snapshot: how long its generation's
// journal was known to be durably when the snapshot was installed.
func metaPayload(journalMin int64) []byte {
	return binary.AppendUvarint([]byte{metaTag}, uint64(journalMin))
}

func parseMeta(payload []byte) (int64, error) {
	d := decoder{b: payload}
	if tag := d.byte(); d.err == nil && tag != metaTag {
		return 0, fmt.Errorf("first frame is not the snapshot's meta frame (tag %d)", tag)
	}
	n := d.uvarint()
	switch {
	case d.err != nil:
		return 0, d.err
	case len(d.b) > 0:
		return 0, fmt.Errorf("%d stray bytes after the meta record", len(d.b))
	case n > 1<<62:
		return 0, fmt.Errorf("journal length %d is implausible", n)
	}
	return int64(n), nil
}

// applyJournalPayload replays the records of one journal frame into state
// and returns how many records it held. With a nil state it only checks
// the payload.
func applyJournalPayload(payload []byte, state map[string][]byte) (int, error) {
	if len(payload) == 0 {
		return 0, errors.New("empty frame")
	}
	d := decoder{b: payload}
	records := 0
	for len(d.b) > 0 && d.err == nil {
		n := d.uvarint()
		if d.err == nil && n == 0 {
			d.err = errors.New("record with no ops")
		}
		for i := uint64(0); i < n && d.err == nil; i++ {
			switch tag := d.byte(); tag {
			case opPut:
				k := d.bytes()
				v := d.bytes()
				if d.err == nil && state != nil {
					state[string(k)] = cloneValue(v)
				}
			case opDelete:
				k := d.bytes()
				if d.err == nil && state != nil {
					delete(state, string(k))
				}
			default:
				if d.err == nil {
					d.err = fmt.Errorf("unknown op tag %d", tag)
				}
			}
		}
		records++
	}
	return records, d.err
}

// applySnapshotPayload loads the entries of one snapshot frame.
func applySnapshotPayload(payload []byte, state map[string][]byte) (int, error) {
	d := decoder{b: payload}
	n := 0
	for len(d.b) > 0 && d.err == nil {
		k := d.bytes()
		v := d.bytes()
		if d.err == nil {
			state[string(k)] = cloneValue(v)
			n++
		}
	}
	return n, d.err
}

// frameReader reads the frames of one file from its header up to size,
// the file's length when it was opened.
type frameReader struct {
	path string
	f    io.ReaderAt
	r    *bufio.Reader
	off  int64
	size int64
	hdr  [frameHeaderSize]byte
	buf  []byte
	sum  uint32 // payload checksum of the last frame read whole
}

func newFrameReader(path string, f io.ReaderAt, size int64) *frameReader {
	return &frameReader{
		path: path,
		f:    f,
		r:    bufio.NewReaderSize(io.NewSectionReader(f, headerSize, size-headerSize), int(min(1<<20, max(16, size-headerSize)))),
		off:  headerSize,
		size: size,
	}
}

// frameFault describes a frame that could not be read whole. mayBeTorn is
// set when the damage is consistent with an interrupted final write.
type frameFault struct {
	off       int64
	reason    string
	mayBeTorn bool
	// complete: the frame's header is intact and its length ends exactly
	// at the end of the file, but its payload fails the checksum.
	complete bool
}

// next returns the next payload (valid until the following call), io.EOF
// at a clean end, or a *frameFault.
func (fr *frameReader) next() ([]byte, *frameFault, error) {
	left := fr.size - fr.off
	if left == 0 {
		return nil, nil, io.EOF
	}
	if left < frameHeaderSize {
		return nil, &frameFault{off: fr.off, reason: fmt.Sprintf("%d trailing bytes are too short for a frame header", left), mayBeTorn: true}, nil
	}
	if _, err := io.ReadFull(fr.r, fr.hdr[:]); err != nil {
		return nil, nil, fmt.Errorf("read %s at offset %d: %w", fr.path, fr.off, err)
	}
	n, sum, ok := frameHeaderOK(fr.hdr[:])
	if !ok {
		torn, err := fr.tornAfterBadHeader()
		if err != nil {
			return nil, nil, err
		}
		return nil, &frameFault{off: fr.off, reason: "frame header checksum mismatch", mayBeTorn: torn}, nil
	}
	if n > maxFrame {
		return nil, &frameFault{off: fr.off, reason: fmt.Sprintf("frame length %d exceeds the %d limit", n, maxFrame)}, nil
	}
	end := fr.off + frameHeaderSize + int64(n)
	if end > fr.size {
		return nil, &frameFault{off: fr.off, reason: fmt.Sprintf("frame of %d bytes extends past the end of the file (%d)", n, fr.size), mayBeTorn: true}, nil
	}
	if cap(fr.buf) < int(n) {
		fr.buf = make([]byte, n)
	}
	fr.buf = fr.buf[:n]
	if _, err := io.ReadFull(fr.r, fr.buf); err != nil {
		return nil, nil, fmt.Errorf("read %s at offset %d: %w", fr.path, fr.off, err)
	}
	if crc32.Checksum(fr.buf, castagnoli) != sum {
		// Only the last frame can be a torn write: a group commit writes
		// exactly one frame and fsyncs it before the next is written.
		return nil, &frameFault{off: fr.off, reason: "frame checksum mismatch", mayBeTorn: end == fr.size, complete: end == fr.size}, nil
	}
	fr.off = end
	fr.sum = sum
	return fr.buf, nil, nil
}

// tornAfterBadHeader decides whether a frame header that fails its checksum
// is the start of a torn final write (nothing valid follows) or damage in
// the middle of the file (a whole valid frame follows somewhere later).
func (fr *frameReader) tornAfterBadHeader() (bool, error) {
	from := fr.off + 1
	if fr.size-from < frameHeaderSize {
		return true, nil
	}
	rest := make([]byte, fr.size-from)
	if _, err := fr.f.ReadAt(rest, from); err != nil {
		return false, fmt.Errorf("read %s at offset %d: %w", fr.path, from, err)
	}
	for i := 0; i+frameHeaderSize <= len(rest); i++ {
		n, sum, ok := frameHeaderOK(rest[i : i+frameHeaderSize])
		if !ok || int64(n) > int64(len(rest)-i-frameHeaderSize) {
			continue
		}
		if crc32.Checksum(rest[i+frameHeaderSize:i+frameHeaderSize+int(n)], castagnoli) == sum {
			return false, nil
		}
	}
	return true, nil
}
