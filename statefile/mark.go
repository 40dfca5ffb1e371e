package statefile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sort"
	"syscall"
)

// The mark file (P.mark) records, for every group commit before any of its
// records is acknowledged, how far the journal is acknowledged and the
// newest values of the pinned keys. It is what tells a journal cut
// exactly at a frame boundary, or a damaged final frame, from a crash
// before those frames were written, and what keeps counters (operation
// ids, fence epochs) from regressing when records are lost.
//
// It is two slots of markSlotSize bytes; writes alternate between them,
// so a torn write leaves the other, older slot (which covers less) whole.
// A slot is: magic, version, a sequence number (the newer slot wins), the
// generation and acknowledged length of the journal, the checksum of the
// frame that ends there, the number of records acknowledged in that
// journal, the pinned key/value pairs, and a CRC32C of all of it.
const (
	markVersion  = 1
	markSlotSize = 32 << 10
	markFileSize = 2 * markSlotSize
	// markFixed is the slot's fixed part: magic 8, version 2, seq 8, gen
	// 8, length 8, frame checksum 4, records 8, pinned length 4.
	markFixed = 8 + 2 + 8 + 8 + 8 + 4 + 8 + 4
	// MaxPinnedBytes bounds the encoded pinned keys and values.
	MaxPinnedBytes = markSlotSize - markFixed - 4
)

var markMagic = [8]byte{'B', 'F', 'M', 'A', 'R', 'K', 0, 0}

// mark is one slot's content.
type mark struct {
	seq     uint64
	gen     uint64
	length  int64  // the journal of gen is acknowledged up to here
	sum     uint32 // payload checksum of the frame that ends at length
	records uint64 // records acknowledged in the journal of gen
	pinned  map[string][]byte
}

func (m *mark) encode() ([]byte, error) {
	pinned := encodePinned(m.pinned)
	if len(pinned) > MaxPinnedBytes {
		return nil, fmt.Errorf("the pinned keys hold %d bytes, more than the mark's %d", len(pinned), MaxPinnedBytes)
	}
	b := make([]byte, 0, markFixed+len(pinned)+4)
	b = append(b, markMagic[:]...)
	b = binary.LittleEndian.AppendUint16(b, markVersion)
	b = binary.LittleEndian.AppendUint64(b, m.seq)
	b = binary.LittleEndian.AppendUint64(b, m.gen)
	b = binary.LittleEndian.AppendUint64(b, uint64(m.length))
	b = binary.LittleEndian.AppendUint32(b, m.sum)
	b = binary.LittleEndian.AppendUint64(b, m.records)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(pinned)))
	b = append(b, pinned...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

// decodeMark reads one slot; ok is false for a slot that was never
// written, or whose write was torn (any damage reads the same).
func decodeMark(b []byte) (mark, bool) {
	if len(b) < markFixed+4 || !bytes.Equal(b[:8], markMagic[:]) {
		return mark{}, false
	}
	n := int(binary.LittleEndian.Uint32(b[markFixed-4:]))
	if n > MaxPinnedBytes || markFixed+n+4 > len(b) {
		return mark{}, false
	}
	body := b[:markFixed+n]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(b[markFixed+n:]) {
		return mark{}, false
	}
	if binary.LittleEndian.Uint16(b[8:]) != markVersion {
		return mark{}, false
	}
	m := mark{
		seq:     binary.LittleEndian.Uint64(b[10:]),
		gen:     binary.LittleEndian.Uint64(b[18:]),
		length:  int64(binary.LittleEndian.Uint64(b[26:])),
		sum:     binary.LittleEndian.Uint32(b[34:]),
		records: binary.LittleEndian.Uint64(b[38:]),
	}
	pinned, err := decodePinned(body[markFixed:])
	if err != nil || m.gen == 0 || m.length < headerSize {
		return mark{}, false
	}
	m.pinned = pinned
	return m, true
}

func encodePinned(p map[string][]byte) []byte {
	keys := make([]string, 0, len(p))
	for k := range p {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b []byte
	b = binary.AppendUvarint(b, uint64(len(keys)))
	for _, k := range keys {
		b = appendBytes(b, k)
		b = appendBytes(b, p[k])
	}
	return b
}

func decodePinned(b []byte) (map[string][]byte, error) {
	d := decoder{b: b}
	n := d.uvarint()
	if d.err == nil && n > uint64(len(b)) {
		d.err = errors.New("implausible count")
	}
	out := make(map[string][]byte, min(n, 64))
	for i := uint64(0); i < n && d.err == nil; i++ {
		k := d.bytes()
		v := d.bytes()
		if d.err == nil {
			out[string(k)] = cloneValue(v)
		}
	}
	if d.err == nil && len(d.b) > 0 {
		d.err = errors.New("stray bytes")
	}
	return out, d.err
}

// readMark returns the newer whole slot of the mark file f (path names
// it). A file without a whole slot is a *CorruptError: Open creates the
// mark before anything relies on it, and writes it whole.
func readMark(path string, f io.ReaderAt) (mark, error) {
	b := make([]byte, markFileSize)
	n, err := f.ReadAt(b, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return mark{}, fmt.Errorf("read %s: %w", path, err)
	}
	b = b[:n]
	var best mark
	found := false
	for _, off := range []int{0, markSlotSize} {
		if off >= len(b) {
			continue
		}
		if m, ok := decodeMark(b[off:min(len(b), off+markSlotSize)]); ok && (!found || m.seq > best.seq) {
			best, found = m, true
		}
	}
	if !found {
		return mark{}, corrupt(path, 0, "no intact mark record (%d bytes)", n)
	}
	return best, nil
}

// markWriter writes the mark file of an open File. The committer owns it.
type markWriter struct {
	path   string
	f      *os.File
	noSync bool
	last   mark // the newest record written
}

// createMark durably replaces path with a mark file holding m, renamed
// into place like a journal; it is not locked itself: the writer holds
// the journal's lock.
func createMark(path string, m mark, noSync bool) (*markWriter, error) {
	m.seq = 1
	slot, err := m.encode()
	if err != nil {
		return nil, err
	}
	buf := make([]byte, markFileSize)
	copy(buf, slot)
	f, err := replaceFile(path, buf, false, noSync)
	if err != nil {
		return nil, err
	}
	return &markWriter{path: path, f: f, noSync: noSync, last: m}, nil
}

// openMark opens an existing mark file for writing after m was read from
// it.
func openMark(path string, m mark, noSync bool) (*markWriter, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return &markWriter{path: path, f: f, noSync: noSync, last: m}, nil
}

// write makes m the newest record: into the slot the newest one is not
// in, then fdatasync.
func (w *markWriter) write(m mark) error {
	m.seq = w.last.seq + 1
	slot, err := m.encode()
	if err != nil {
		return err
	}
	if _, err := w.f.WriteAt(slot, int64((m.seq-1)%2)*markSlotSize); err != nil {
		return fileErr("write", w.path, err)
	}
	if !w.noSync {
		if err := fdatasync(w.f); err != nil {
			return fileErr("fsync", w.path, err)
		}
	}
	w.last = m
	return nil
}

func (w *markWriter) close() error {
	if w == nil || w.f == nil {
		return nil
	}
	return w.f.Close()
}

// named reports whether the mark's path still names the file w writes.
func (w *markWriter) named() (bool, error) { return names(w.path, w.f) }

// fdatasync flushes f's data (and the metadata needed to read it back).
func fdatasync(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = syscall.Fdatasync(int(fd))
			if !errors.Is(serr, syscall.EINTR) {
				return
			}
		}
	}); err != nil {
		return err
	}
	return serr
}
