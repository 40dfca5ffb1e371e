package statefile

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// Recovery is what Open with Recover dropped to get past damage, and what
// it restored: the report it logs and stores under Options.LossKey.
type Recovery struct {
	// Damage is the *CorruptError Open would have failed with.
	Damage string `json:"damage"`
	// Generation is the generation the state was rebuilt as.
	Generation uint64 `json:"generation"`
	// Dropped lists every byte range that is no longer part of the state.
	Dropped []DroppedRange `json:"dropped"`
	// Acknowledged is how many records the mark recorded as acknowledged
	// in the journal where the damage is, Replayed how many of them the
	// state still holds; the difference was lost. Both are zero when the
	// mark says nothing about that journal.
	Acknowledged uint64 `json:"acknowledged_records,omitempty"`
	Replayed     uint64 `json:"replayed_records,omitempty"`
	// Pinned lists the pinned keys whose values were restored from the
	// mark (newer than what the journal still holds).
	Pinned []string `json:"pinned_restored,omitempty"`
	// Mark says why the mark could not be used, if it could not: counters
	// (operation ids, fence epochs) may then have regressed.
	Mark string `json:"mark,omitempty"`
}

// DroppedRange is one range of a file that recovery dropped.
type DroppedRange struct {
	File   string `json:"file"`
	Offset int64  `json:"offset"`
	// Bytes is the range's length; Missing counts bytes the mark records
	// as acknowledged beyond the file's end (a cut).
	Bytes   int64 `json:"bytes"`
	Missing int64 `json:"missing_bytes,omitempty"`
	// Records is how many records of the range's whole frames could still
	// be read (a damaged frame cannot), Keys their keys (at most
	// maxReportKeys, then KeysCut is set).
	Records int      `json:"records"`
	Keys    []string `json:"keys,omitempty"`
	KeysCut bool     `json:"keys_cut,omitempty"`
	Reason  string   `json:"reason,omitempty"`
}

// maxReportKeys bounds the keys a report lists per range.
const maxReportKeys = 100

// String is the report as one paragraph for a log or an error.
func (r *Recovery) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "rebuilt as generation %d after: %s.", r.Generation, r.Damage)
	for _, d := range r.Dropped {
		fmt.Fprintf(&b, " Dropped %s from offset %d: %d bytes", d.File, d.Offset, d.Bytes)
		if d.Missing > 0 {
			fmt.Fprintf(&b, " (and %d acknowledged bytes already missing)", d.Missing)
		}
		if d.Records > 0 {
			fmt.Fprintf(&b, ", %d readable records touching %s", d.Records, strings.Join(quoteAll(d.Keys), ", "))
			if d.KeysCut {
				b.WriteString(", ...")
			}
		}
		b.WriteString(".")
	}
	if r.Acknowledged > r.Replayed {
		fmt.Fprintf(&b, " The mark recorded %d acknowledged records in that journal; %d remain, %d were lost.", r.Acknowledged, r.Replayed, r.Acknowledged-r.Replayed)
	}
	if len(r.Pinned) > 0 {
		fmt.Fprintf(&b, " Restored from the mark: %s.", strings.Join(quoteAll(r.Pinned), ", "))
	}
	if r.Mark != "" {
		fmt.Fprintf(&b, " The mark was not used: %s.", r.Mark)
	}
	return b.String()
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}

// Recovered returns what Open with Recover dropped, nil if it dropped
// nothing.
func (f *File) Recovered() *Recovery { return f.recovered }

// pinnedOf returns the pinned keys of state.
func (f *File) pinnedOf(state map[string][]byte) map[string][]byte {
	out := make(map[string][]byte)
	if f.opts.Pinned == nil {
		return out
	}
	for k, v := range state {
		if f.opts.Pinned(k) {
			out[k] = v
		}
	}
	return out
}

// setMark makes m the mark's newest record, creating the file if this
// File has none yet.
func (f *File) setMark(m mark) error {
	if m.pinned == nil {
		m.pinned = f.pinned
	}
	if f.mark == nil {
		w, err := createMark(f.p.mark, m, f.opts.NoSync)
		if err != nil {
			return err
		}
		f.mark = w
		return nil
	}
	return f.mark.write(m)
}

// frameSum is the payload checksum in a framed buffer's header.
func frameSum(framed []byte) uint32 { return binary.LittleEndian.Uint32(framed[4:8]) }

// startSum is the payload checksum of the start frame of gen.
func startSum(gen uint64) uint32 { return frameSum(controlFrame(ctlStart, gen)) }

// rebuild installs what load could read before the damage as a new
// generation, the way an upgrade does: the new journal at P.journal.next,
// the mark, the snapshot, then the rename; a crash anywhere in between
// leaves a state that either still shows the damage (and is recovered
// again) or is the rebuilt one.
func (f *File) rebuild(ld *loaded, start time.Time) error {
	rep := f.report(ld)
	state := ld.state
	if m := ld.mark; m != nil && m.gen >= ld.snapGen && f.opts.Pinned != nil {
		for k, v := range m.pinned {
			if f.opts.Pinned(k) {
				if old, ok := state[k]; !ok || string(old) != string(v) {
					rep.Pinned = append(rep.Pinned, k)
				}
				state[k] = v
			}
		}
		sort.Strings(rep.Pinned)
	}
	gen := ld.snapGen + 1
	rep.Generation = gen
	if f.opts.LossKey != "" {
		raw, err := json.Marshal(rep)
		if err != nil {
			return fmt.Errorf("recover: encode the report: %w", err)
		}
		state[f.opts.LossKey] = raw
	}
	f.state = state
	f.pinned = f.pinnedOf(state)
	empty := int64(len(journalStart(gen)))
	jf, err := createJournal(f.p.next, gen, f.opts.NoSync)
	if err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	err = func() error {
		if err := f.setMark(mark{gen: gen, length: empty, sum: startSum(gen)}); err != nil {
			return err
		}
		size, err := writeSnapshot(f.p.snap, gen, state, empty, f.opts.NoSync)
		if err != nil {
			return err
		}
		f.snapBytes.Store(size)
		if err := os.Rename(f.p.next, f.p.journal); err != nil {
			return fmt.Errorf("rename %s: %w", f.p.next, err)
		}
		if err := syncDir(f.p.dir, f.opts.NoSync); err != nil {
			return err
		}
		return f.removeStale(ld.stale)
	}()
	if err != nil {
		jf.Close()
		return fmt.Errorf("recover: %w", err)
	}
	f.journal = jf
	f.journalPath = f.p.journal
	f.gen, f.snapGen = gen, gen
	f.journalBytes.Store(empty)
	f.records = 0
	f.recovered = rep
	f.log.Error("state recovered: acknowledged records were dropped", "report", rep.String(), "generation", gen,
		"keys", len(state), "duration", time.Since(start))
	return nil
}

// report describes what rebuilding from ld drops.
func (f *File) report(ld *loaded) *Recovery {
	rep := &Recovery{Mark: ld.markTrouble}
	reason := "the mark could not be used"
	if ld.damage != nil {
		rep.Damage, reason = ld.damage.Error(), ld.damage.Reason
	} else {
		rep.Damage = ld.markTrouble
	}
	if n := len(ld.chain); n > 0 {
		j := ld.chain[n-1]
		d := DroppedRange{File: j.path, Offset: j.end, Bytes: j.size - j.end, Reason: reason}
		if m := ld.mark; m != nil && m.gen == j.gen {
			rep.Acknowledged, rep.Replayed = m.records, uint64(j.records)
			if m.length > j.size {
				d.Missing = m.length - j.size
			}
		}
		if d.Bytes > 0 {
			if fh, err := os.Open(j.path); err == nil {
				d.Records, d.Keys, d.KeysCut = readableRecords(fh, j.end+1, j.size, true)
				fh.Close()
			}
		}
		if d.Bytes > 0 || d.Missing > 0 {
			rep.Dropped = append(rep.Dropped, d)
		}
	}
	for _, j := range ld.dropped {
		d := DroppedRange{File: j.path, Offset: 0, Bytes: j.size, Reason: "follows the damage"}
		d.Records, d.Keys, d.KeysCut = readableRecords(j.f, headerSize, j.size, false)
		rep.Dropped = append(rep.Dropped, d)
	}
	return rep
}

// readableRecords counts the records of the whole frames of f in
// [from, size) and collects their keys. With scan, the first frame is
// searched for byte by byte (what precedes it is damaged); without, the
// frames start at from.
func readableRecords(f io.ReaderAt, from, size int64, scan bool) (records int, keys []string, cut bool) {
	if from >= size {
		return 0, nil, false
	}
	b := make([]byte, size-from)
	if _, err := f.ReadAt(b, from); err != nil && !errors.Is(err, io.EOF) {
		return 0, nil, false
	}
	seen := map[string]bool{}
	i := 0
	for i+frameHeaderSize <= len(b) {
		n, sum, ok := frameHeaderOK(b[i : i+frameHeaderSize])
		end := i + frameHeaderSize + int(n)
		if !ok || int64(n) > int64(len(b)-i-frameHeaderSize) || crc32.Checksum(b[i+frameHeaderSize:end], castagnoli) != sum {
			if !scan {
				break
			}
			i++
			continue
		}
		scan = false
		payload := b[i+frameHeaderSize : end]
		i = end
		if _, isControl, _ := parseControl(payload); isControl {
			continue
		}
		d := decoder{b: payload}
		for len(d.b) > 0 && d.err == nil {
			ops := d.uvarint()
			for range ops {
				tag := d.byte()
				k := d.bytes()
				if tag == opPut {
					d.bytes()
				}
				if d.err == nil && !seen[string(k)] {
					seen[string(k)] = true
					if len(keys) < maxReportKeys {
						keys = append(keys, string(k))
					} else {
						cut = true
					}
				}
			}
			if d.err == nil {
				records++
			}
		}
	}
	sort.Strings(keys)
	return records, keys, cut
}
