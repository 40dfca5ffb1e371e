package statefile

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Regression tests for issue 17, item 2: damage to acknowledged records is
// not a crash. Before, a flipped bit or a zeroed range in the final,
// complete, fsynced frame was truncated with a WARN (the acknowledged
// mutation gone, its op id and fence mark reissued), and a journal cut
// exactly at a frame boundary lost acknowledged records without a word.

// pinnedMeta is the pinned key the tests use, as the desired document's
// counters would be.
const pinnedMeta = "meta/doc"

func pinOpts() Options {
	return Options{NoSync: true, CompactBytes: -1, Pinned: func(k string) bool { return k == pinnedMeta }, LossKey: "meta/loss"}
}

// writeAcked writes n acknowledged records, one frame each, each also
// moving the pinned counter, and returns the journal's frame offsets and
// length.
func writeAcked(t *testing.T, path string, n int) ([]int64, int64) {
	t.Helper()
	f := mustOpen(t, path, pinOpts())
	for i := range n {
		mustApply(t, f, put(fmt.Sprintf("m/%d", i), fmt.Sprintf(`{"n":%d}`, i)), put(pinnedMeta, fmt.Sprintf(`{"next_op":%d}`, i+1)))
	}
	mustClose(t, f)
	return frameOffsets(t, pathsFor(path).journal)
}

func ackedWant(n int) map[string][]byte {
	m := map[string][]byte{}
	for i := range n {
		m[fmt.Sprintf("m/%d", i)] = []byte(fmt.Sprintf(`{"n":%d}`, i))
	}
	if n > 0 {
		m[pinnedMeta] = []byte(fmt.Sprintf(`{"next_op":%d}`, n))
	}
	return m
}

// refused checks that Open and ReadOnly refuse path with a recoverable
// *CorruptError naming file and offset, and leave the files as they are.
func refused(t *testing.T, path, file string, offset int64, contains string) {
	t.Helper()
	before := readAll(t, path)
	_, openErr := Open(path, pinOpts())
	_, roErr := ReadOnly(path)
	for name, err := range map[string]error{"Open": openErr, "ReadOnly": roErr} {
		var ce *CorruptError
		if !errors.As(err, &ce) {
			t.Fatalf("%s = %v, want a *CorruptError", name, err)
		}
		if ce.Path != file || ce.Offset != offset || !ce.Recoverable || !strings.Contains(ce.Reason, contains) {
			t.Fatalf("%s = %v (at %s:%d, recoverable %t), want a recoverable one at %s:%d saying %q", name, err, ce.Path, ce.Offset, ce.Recoverable, file, offset, contains)
		}
	}
	if diff := cmp.Diff(before, readAll(t, path)); diff != "" {
		t.Fatalf("a refused Open changed the files (-before +after):\n%s", diff)
	}
}

// readAll maps every state file but the lock to its bytes.
func readAll(t *testing.T, path string) map[string]string {
	t.Helper()
	p := pathsFor(path)
	out := map[string]string{}
	for _, f := range []string{p.snap, p.journal, p.next, p.mark} {
		b, err := os.ReadFile(f)
		if err == nil {
			out[f] = string(b)
		}
	}
	return out
}

// TestDamagedLastFrameIsRefused flips every bit of the last, acknowledged
// frame in turn (header and payload): each is refused, naming the journal
// and the frame's offset; none is called torn.
func TestDamagedLastFrameIsRefused(t *testing.T) {
	const n = 4
	path := statePath(t)
	offs, size := writeAcked(t, path, n)
	jpath := pathsFor(path).journal
	clean, err := os.ReadFile(jpath)
	if err != nil {
		t.Fatal(err)
	}
	last := offs[len(offs)-1]
	positions := 0
	for bit := last * 8; bit < size*8; bit++ {
		b := append([]byte(nil), clean...)
		b[bit/8] ^= 1 << (bit % 8)
		if err := os.WriteFile(jpath, b, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Run(fmt.Sprintf("bit %d", bit-last*8), func(t *testing.T) {
			refused(t, path, jpath, last, "acknowledged")
		})
		positions++
	}
	// Zeroing the frame, or a range inside it, is the same damage.
	for _, zero := range [][2]int64{{last, size}, {last + frameHeaderSize, size}, {last + frameHeaderSize + 2, last + frameHeaderSize + 6}} {
		b := append([]byte(nil), clean...)
		clear(b[zero[0]:zero[1]])
		if err := os.WriteFile(jpath, b, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Run(fmt.Sprintf("zeroed %d-%d", zero[0]-last, zero[1]-last), func(t *testing.T) {
			refused(t, path, jpath, last, "acknowledged")
		})
		positions++
	}
	t.Logf("%d damaged positions in a last frame of %d bytes, all refused", positions, size-last)
}

// TestCutAtFrameBoundaryIsRefused cuts the journal exactly at every frame
// boundary of the last frames (and inside each): nothing of a cut tells it
// from a crash but the mark, which records what was acknowledged.
func TestCutAtFrameBoundaryIsRefused(t *testing.T) {
	const n = 6
	path := statePath(t)
	offs, size := writeAcked(t, path, n)
	jpath := pathsFor(path).journal
	clean, err := os.ReadFile(jpath)
	if err != nil {
		t.Fatal(err)
	}
	// offs[0] is the start frame; cut before each of the last five
	// record frames, and in the middle of each.
	for i := len(offs) - 5; i < len(offs); i++ {
		for _, cut := range []int64{offs[i], offs[i] + 7, (offs[i] + min(size, nextOff(offs, i, size))) / 2} {
			if err := os.WriteFile(jpath, clean[:cut], 0o600); err != nil {
				t.Fatal(err)
			}
			t.Run(fmt.Sprintf("cut at %d", cut), func(t *testing.T) {
				want := offs[i] // the end of the last whole frame
				refused(t, path, jpath, want, "acknowledged")
			})
		}
	}
}

func nextOff(offs []int64, i int, size int64) int64 {
	if i+1 < len(offs) {
		return offs[i+1]
	}
	return size
}

// TestRecoverDropsAndReports: Options.Recover gets past the damage, keeps
// everything before it, restores the pinned counter from the mark (so it
// does not regress), reports exactly what was dropped, and leaves a state
// that opens without Recover.
func TestRecoverDropsAndReports(t *testing.T) {
	const n = 5
	for _, tc := range []struct {
		name     string
		damage   func(b []byte, offs []int64) []byte
		bytes    int64 // dropped from the file
		missing  int64 // acknowledged bytes already gone
		readable int   // records still readable in the dropped range
	}{
		{"bit flipped in the last frame", func(b []byte, offs []int64) []byte {
			b[len(b)-2] ^= 0x10
			return b
		}, -1, 0, 0},
		{"cut at the last frame boundary", func(b []byte, offs []int64) []byte { return b[:offs[len(offs)-1]] }, 0, -1, 0},
		{"bit flipped in the last but one frame", func(b []byte, offs []int64) []byte {
			b[offs[len(offs)-2]+frameHeaderSize+1] ^= 1
			return b
		}, -2, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := statePath(t)
			offs, size := writeAcked(t, path, n)
			p := pathsFor(path)
			editFile(t, p.journal, func(b []byte) []byte { return tc.damage(b, offs) })
			lastWhole := offs[len(offs)-1]
			keep := n - 1
			if tc.bytes == -2 {
				lastWhole, keep = offs[len(offs)-2], n-2
			}

			opts := pinOpts()
			opts.Recover = true
			f := mustOpen(t, path, opts)
			rep := f.Recovered()
			if rep == nil {
				t.Fatal("Recovered() = nil after dropping damage")
			}
			want := ackedWant(keep)
			want[pinnedMeta] = ackedWant(n)[pinnedMeta] // restored from the mark: no regression
			got := f.Snapshot()
			if loss := got["meta/loss"]; len(loss) == 0 {
				t.Errorf("no report stored under the loss key")
			} else {
				var stored Recovery
				if err := json.Unmarshal(loss, &stored); err != nil || stored.Generation != rep.Generation {
					t.Errorf("stored report %s: %v", loss, err)
				}
			}
			delete(got, "meta/loss")
			if diff := cmp.Diff(want, got, asStrings); diff != "" {
				t.Errorf("recovered state (-want +got):\n%s", diff)
			}
			wantBytes := size - lastWhole
			if tc.bytes == 0 {
				wantBytes = 0
			}
			wantMissing := int64(0)
			if tc.missing == -1 {
				wantMissing = size - lastWhole
			}
			if len(rep.Dropped) != 1 || rep.Dropped[0].File != p.journal || rep.Dropped[0].Offset != lastWhole ||
				rep.Dropped[0].Bytes != wantBytes || rep.Dropped[0].Missing != wantMissing || rep.Dropped[0].Records != tc.readable {
				t.Errorf("dropped %+v, want %s from %d: %d bytes, %d missing, %d readable records", rep.Dropped, p.journal, lastWhole, wantBytes, wantMissing, tc.readable)
			}
			if rep.Acknowledged != n || rep.Replayed != uint64(keep) {
				t.Errorf("acknowledged %d replayed %d, want %d and %d", rep.Acknowledged, rep.Replayed, n, keep)
			}
			if diff := cmp.Diff([]string{pinnedMeta}, rep.Pinned); diff != "" {
				t.Errorf("pinned restored (-want +got):\n%s", diff)
			}
			if s := rep.String(); !strings.Contains(s, p.journal) || !strings.Contains(s, fmt.Sprintf("from offset %d", lastWhole)) {
				t.Errorf("report %q does not name the file and offset", s)
			}
			mustApply(t, f, put("m/after", "1"))
			mustClose(t, f)

			// The rebuilt state opens without Recover and keeps all of it.
			want["m/after"] = []byte("1")
			g := mustOpen(t, path, pinOpts())
			if g.Recovered() != nil {
				t.Errorf("a plain Open reports a recovery")
			}
			got = g.Snapshot()
			delete(got, "meta/loss")
			if diff := cmp.Diff(want, got, asStrings); diff != "" {
				t.Errorf("reopened (-want +got):\n%s", diff)
			}
			mustClose(t, g)
		})
	}
}

// TestRecoverWithoutDamageChangesNothing: Recover on a sound state drops
// nothing and reports nothing.
func TestRecoverWithoutDamageChangesNothing(t *testing.T) {
	path := statePath(t)
	writeAcked(t, path, 3)
	before := readAll(t, path)
	opts := pinOpts()
	opts.Recover = true
	f := mustOpen(t, path, opts)
	if f.Recovered() != nil {
		t.Errorf("Recovered() = %v on a sound state", f.Recovered())
	}
	if diff := cmp.Diff(ackedWant(3), f.Snapshot(), asStrings); diff != "" {
		t.Errorf("state (-want +got):\n%s", diff)
	}
	mustClose(t, f)
	if diff := cmp.Diff(before, readAll(t, path)); diff != "" {
		t.Errorf("files changed (-before +after):\n%s", diff)
	}
}

// TestMarkLossIsRefused: without the mark, nothing says what was
// acknowledged; a snapshot that promises one refuses to open without it,
// and a damaged mark is refused too.
func TestMarkLossIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, p paths)
		want   string
	}{
		{"deleted", func(t *testing.T, p paths) {
			if err := os.Remove(p.mark); err != nil {
				t.Fatal(err)
			}
		}, "the mark file is missing"},
		{"both slots damaged", func(t *testing.T, p paths) {
			editFile(t, p.mark, func(b []byte) []byte {
				b[3] ^= 1
				b[markSlotSize+3] ^= 1
				return b
			})
		}, "no intact mark record"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := statePath(t)
			writeAcked(t, path, 3)
			p := pathsFor(path)
			tc.damage(t, p)
			_, err := Open(path, pinOpts())
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Path != p.mark || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open = %v, want a *CorruptError about %s saying %q", err, p.mark, tc.want)
			}
			opts := pinOpts()
			opts.Recover = true
			f := mustOpen(t, path, opts)
			if rep := f.Recovered(); rep == nil || rep.Mark == "" {
				t.Errorf("Recovered() = %+v, want the mark's trouble reported", rep)
			}
			got := f.Snapshot()
			delete(got, "meta/loss")
			if diff := cmp.Diff(ackedWant(3), got, asStrings); diff != "" {
				t.Errorf("recovered (-want +got):\n%s", diff)
			}
			mustClose(t, f)
			mustClose(t, mustOpen(t, path, pinOpts()))
		})
	}
}

// TestTornMarkSlotFallsBack: a torn write of the mark's newer slot leaves
// the older one, which records less: the journal beyond it is a torn tail
// (never acknowledged), not damage.
func TestTornMarkSlotFallsBack(t *testing.T) {
	path := statePath(t)
	writeAcked(t, path, 3)
	p := pathsFor(path)
	m, err := readMarkFile(p.mark)
	if err != nil {
		t.Fatal(err)
	}
	editFile(t, p.mark, func(b []byte) []byte {
		slot := int64((m.seq-1)%2) * markSlotSize
		b[slot+20] ^= 0xff // the newest slot's generation: its checksum fails
		return b
	})
	f := mustOpen(t, path, pinOpts())
	if diff := cmp.Diff(ackedWant(3), f.Snapshot(), asStrings); diff != "" {
		t.Errorf("state (-want +got):\n%s", diff)
	}
	mustClose(t, f)
}

func readMarkFile(path string) (mark, error) {
	fh, err := os.Open(path)
	if err != nil {
		return mark{}, err
	}
	defer fh.Close()
	return readMark(path, fh)
}
