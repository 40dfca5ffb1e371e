package statefile

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func bytesMap(m map[string]string) map[string][]byte {
	out := make(map[string][]byte, len(m))
	for k, v := range m {
		out[k] = []byte(v)
	}
	return out
}

func TestReplay(t *testing.T) {
	big := strings.Repeat("x", 1<<20)
	var churn [][]Op
	churnWant := map[string]string{}
	for i := range 300 {
		k := fmt.Sprintf("m/%d", i%37)
		if i%7 == 3 {
			churn = append(churn, []Op{del(k)})
			delete(churnWant, k)
			continue
		}
		v := fmt.Sprintf(`{"i":%d}`, i)
		churn = append(churn, []Op{put(k, v), put("meta/last", v)})
		churnWant[k], churnWant["meta/last"] = v, v
	}
	tests := []struct {
		name         string
		records      [][]Op
		compactAfter map[int]bool // compact after applying records[i]
		want         map[string]string
	}{
		{name: "empty", want: map[string]string{}},
		{
			name:    "puts",
			records: [][]Op{{put("m/a", "1")}, {put("m/b", "2")}},
			want:    map[string]string{"m/a": "1", "m/b": "2"},
		},
		{
			name:    "overwrite",
			records: [][]Op{{put("m/a", "1")}, {put("m/a", "2")}},
			want:    map[string]string{"m/a": "2"},
		},
		{
			name:    "delete",
			records: [][]Op{{put("m/a", "1")}, {put("m/b", "2")}, {del("m/a")}},
			want:    map[string]string{"m/b": "2"},
		},
		{
			name:    "delete of a missing key",
			records: [][]Op{{del("m/none")}},
			want:    map[string]string{},
		},
		{
			name:    "ops of one record apply in order",
			records: [][]Op{{put("m/a", "1"), del("m/a"), put("m/b", "2"), put("m/b", "3")}},
			want:    map[string]string{"m/b": "3"},
		},
		{
			name:    "empty value and binary key",
			records: [][]Op{{put("f/shard\x00m1", ""), put("", "root")}},
			want:    map[string]string{"f/shard\x00m1": "", "": "root"},
		},
		{
			name:    "large value",
			records: [][]Op{{put("m/big", big)}, {put("m/small", "s")}},
			want:    map[string]string{"m/big": big, "m/small": "s"},
		},
		{
			name:         "compaction between records",
			records:      [][]Op{{put("m/a", "1"), put("m/b", "1")}, {del("m/a")}, {put("m/c", "3")}},
			compactAfter: map[int]bool{0: true, 1: true},
			want:         map[string]string{"m/b": "1", "m/c": "3"},
		},
		{
			name:         "churn across compactions",
			records:      churn,
			compactAfter: map[int]bool{50: true, 51: true, 190: true},
			want:         churnWant,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := statePath(t)
			f := mustOpen(t, path, Options{})
			m := NewMemory(nil)
			for i, ops := range tt.records {
				mustApply(t, f, ops...)
				mustApply(t, m, ops...)
				if tt.compactAfter[i] {
					if err := f.compactNow(context.Background()); err != nil {
						t.Fatalf("compact: %v", err)
					}
				}
			}
			want := bytesMap(tt.want)
			if diff := cmp.Diff(want, f.Snapshot(), asStrings); diff != "" {
				t.Errorf("live Snapshot (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(want, m.Snapshot(), asStrings); diff != "" {
				t.Errorf("Memory Snapshot (-want +got):\n%s", diff)
			}
			mustClose(t, f)
			if diff := cmp.Diff(want, reopen(t, path), asStrings); diff != "" {
				t.Errorf("after reopen (-want +got):\n%s", diff)
			}
			got, err := ReadOnly(path)
			if err != nil {
				t.Fatalf("ReadOnly: %v", err)
			}
			if diff := cmp.Diff(want, got, asStrings); diff != "" {
				t.Errorf("ReadOnly (-want +got):\n%s", diff)
			}
		})
	}
}

// writeFramesUnmarked creates a state with one journal frame per record
// and returns the journal's frame offsets and length, with the mark left
// as it was before the last frame: the files a crash between the last frame's
// fsync and its mark's leaves, so that frame was never acknowledged.
func writeFramesUnmarked(t *testing.T, path string, n int) ([]int64, int64) {
	t.Helper()
	f := mustOpen(t, path, Options{})
	for i := range n {
		if i == n-1 {
			mustClose(t, f)
			before, err := os.ReadFile(pathsFor(path).mark)
			if err != nil {
				t.Fatal(err)
			}
			f = mustOpen(t, path, Options{})
			defer func() {
				if err := os.WriteFile(pathsFor(path).mark, before, 0o600); err != nil {
					t.Fatal(err)
				}
			}()
		}
		mustApply(t, f, put(fmt.Sprintf("m/%d", i), fmt.Sprintf(`{"n":%d,"pad":"%s"}`, i, strings.Repeat("p", 40))))
	}
	mustClose(t, f)
	return frameOffsets(t, pathsFor(path).journal)
}

func wantFirst(n int) map[string][]byte {
	m := map[string][]byte{}
	for i := range n {
		m[fmt.Sprintf("m/%d", i)] = []byte(fmt.Sprintf(`{"n":%d,"pad":"%s"}`, i, strings.Repeat("p", 40)))
	}
	return m
}

// TestTornTailIsTruncated: a last frame the mark does not record as
// acknowledged (a crash between its write and the mark's) that is cut or
// damaged is a torn write: dropped, and Open truncates it. (Damage to an
// acknowledged frame is not: TestDamagedLastFrameIsRefused.)
func TestTornTailIsTruncated(t *testing.T) {
	const n = 5
	tests := []struct {
		name string
		// damage edits the journal bytes; last is where the final frame starts.
		damage func(b []byte, last int64) []byte
		keep   int // records that survive
	}{
		{"intact", func(b []byte, _ int64) []byte { return b }, n},
		{"last frame cut by one byte", func(b []byte, _ int64) []byte { return b[:len(b)-1] }, n - 1},
		{"last frame cut inside its header", func(b []byte, last int64) []byte { return b[:last+5] }, n - 1},
		{"last frame cut after its header", func(b []byte, last int64) []byte { return b[:last+frameHeaderSize+3] }, n - 1},
		{"last payload byte flipped", func(b []byte, _ int64) []byte { b[len(b)-1] ^= 0xff; return b }, n - 1},
		{"zeros after the last frame", func(b []byte, _ int64) []byte { return append(b, make([]byte, 4096)...) }, n},
		{"zeroed last frame", func(b []byte, last int64) []byte {
			clear(b[last:])
			return b
		}, n - 1},
		{"half a header appended", func(b []byte, _ int64) []byte { return append(b, 7, 0, 0) }, n},
		{"frame header claims more than was written", func(b []byte, last int64) []byte {
			h := make([]byte, frameHeaderSize+100)
			putFrameHeader(h)
			return append(b, h[:frameHeaderSize+10]...)
		}, n},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := statePath(t)
			offs, _ := writeFramesUnmarked(t, path, n)
			jpath := pathsFor(path).journal
			b, err := os.ReadFile(jpath)
			if err != nil {
				t.Fatal(err)
			}
			b = tt.damage(b, offs[len(offs)-1])
			if err := os.WriteFile(jpath, b, 0o600); err != nil {
				t.Fatal(err)
			}
			want := wantFirst(tt.keep)

			got, err := ReadOnly(path)
			if err != nil {
				t.Fatalf("ReadOnly: %v", err)
			}
			if diff := cmp.Diff(want, got, asStrings); diff != "" {
				t.Errorf("ReadOnly (-want +got):\n%s", diff)
			}
			if st, err := os.Stat(jpath); err != nil || st.Size() != int64(len(b)) {
				t.Errorf("ReadOnly changed the journal: size %v, err %v, want %d", st.Size(), err, len(b))
			}

			f := mustOpen(t, path, Options{})
			if diff := cmp.Diff(want, f.Snapshot(), asStrings); diff != "" {
				t.Errorf("Open (-want +got):\n%s", diff)
			}
			// Appending after the truncation must produce a clean journal.
			mustApply(t, f, put("m/after", "1"))
			mustClose(t, f)
			want["m/after"] = []byte("1")
			if diff := cmp.Diff(want, reopen(t, path), asStrings); diff != "" {
				t.Errorf("after append and reopen (-want +got):\n%s", diff)
			}
		})
	}
}

// setHeader rewrites a file header field with a valid header checksum, as
// a different build would have written it.
func setHeader(t *testing.T, path string, edit func(h []byte)) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	edit(b[:headerSize])
	binary.LittleEndian.PutUint32(b[28:], crc32.Checksum(b[:28], castagnoli))
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func editFile(t *testing.T, path string, edit func(b []byte) []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, edit(b), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestCorruptionIsAnError(t *testing.T) {
	const n = 5
	tests := []struct {
		name string
		// damage edits the files of a state holding n records, compacted
		// after the first two; offs are the journal's frame offsets.
		damage   func(t *testing.T, p paths, offs []int64)
		file     func(p paths) string
		offset   func(offs []int64) int64
		contains string
		// recoverable: Options.Recover may drop it (damage to journal
		// records, not to headers, start frames or the snapshot).
		recoverable bool
	}{
		{
			name: "payload byte flipped in a middle frame",
			damage: func(t *testing.T, p paths, offs []int64) {
				editFile(t, p.journal, func(b []byte) []byte { b[offs[1]+frameHeaderSize+2] ^= 1; return b })
			},
			file:        func(p paths) string { return p.journal },
			offset:      func(offs []int64) int64 { return offs[1] },
			contains:    "frame checksum mismatch",
			recoverable: true,
		},
		{
			name: "garbage over a middle frame header",
			damage: func(t *testing.T, p paths, offs []int64) {
				editFile(t, p.journal, func(b []byte) []byte { copy(b[offs[0]:], "garbage!"); return b })
			},
			file:     func(p paths) string { return p.journal },
			offset:   func(offs []int64) int64 { return offs[0] },
			contains: "frame header checksum mismatch",
		},
		{
			name: "zeroed middle frame",
			damage: func(t *testing.T, p paths, offs []int64) {
				editFile(t, p.journal, func(b []byte) []byte { clear(b[offs[1]:offs[2]]); return b })
			},
			file:        func(p paths) string { return p.journal },
			offset:      func(offs []int64) int64 { return offs[1] },
			contains:    "frame header checksum mismatch",
			recoverable: true,
		},
		{
			name: "journal bad magic",
			damage: func(t *testing.T, p paths, _ []int64) {
				editFile(t, p.journal, func(b []byte) []byte { copy(b, "NOTSTATE"); return b })
			},
			file:     func(p paths) string { return p.journal },
			offset:   func([]int64) int64 { return 0 },
			contains: "bad magic",
		},
		{
			name: "journal from a newer format version",
			damage: func(t *testing.T, p paths, _ []int64) {
				setHeader(t, p.journal, func(h []byte) { h[8] = formatVersion + 1 })
			},
			file:     func(p paths) string { return p.journal },
			offset:   func([]int64) int64 { return 8 },
			contains: fmt.Sprintf("unsupported format version %d", formatVersion+1),
		},
		{
			name: "snapshot header checksum",
			damage: func(t *testing.T, p paths, _ []int64) {
				editFile(t, p.snap, func(b []byte) []byte { b[13] ^= 1; return b })
			},
			file:     func(p paths) string { return p.snap },
			offset:   func([]int64) int64 { return 28 },
			contains: "header checksum mismatch",
		},
		{
			name: "snapshot from a newer format version",
			damage: func(t *testing.T, p paths, _ []int64) {
				setHeader(t, p.snap, func(h []byte) { h[8] = 9 })
			},
			file:     func(p paths) string { return p.snap },
			offset:   func([]int64) int64 { return 8 },
			contains: "unsupported format version 9",
		},
		{
			name: "snapshot truncated",
			damage: func(t *testing.T, p paths, _ []int64) {
				editFile(t, p.snap, func(b []byte) []byte { return b[:len(b)-1] })
			},
			file:     func(p paths) string { return p.snap },
			offset:   func([]int64) int64 { return headerSize + metaFrameSize },
			contains: "extends past the end of the file",
		},
		{
			name: "snapshot payload flipped",
			damage: func(t *testing.T, p paths, _ []int64) {
				editFile(t, p.snap, func(b []byte) []byte { b[len(b)-1] ^= 1; return b })
			},
			file:     func(p paths) string { return p.snap },
			offset:   func([]int64) int64 { return headerSize + metaFrameSize },
			contains: "frame checksum mismatch",
		},
		{
			name: "journal swapped for a snapshot",
			damage: func(t *testing.T, p paths, _ []int64) {
				b, err := os.ReadFile(p.snap)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p.journal, b, 0o600); err != nil {
					t.Fatal(err)
				}
			},
			file:     func(p paths) string { return p.journal },
			offset:   func([]int64) int64 { return 10 },
			contains: `file kind 'S', want 'J'`,
		},
		{
			name: "journal of a generation the snapshot does not know",
			damage: func(t *testing.T, p paths, _ []int64) {
				setHeader(t, p.journal, func(h []byte) { h[12] += 5 })
			},
			file:     func(p paths) string { return p.journal },
			offset:   func([]int64) int64 { return 12 },
			contains: "is ahead of snapshot",
		},
		{
			name: "snapshot missing",
			damage: func(t *testing.T, p paths, _ []int64) {
				if err := os.Remove(p.snap); err != nil {
					t.Fatal(err)
				}
			},
			contains: "snapshot",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := statePath(t)
			f := mustOpen(t, path, Options{})
			for i := range n {
				mustApply(t, f, put(fmt.Sprintf("m/%d", i), fmt.Sprintf(`{"n":%d}`, i)))
				if i == 1 {
					if err := f.compactNow(context.Background()); err != nil {
						t.Fatal(err)
					}
				}
			}
			mustClose(t, f)
			p := pathsFor(path)
			offs, _ := frameOffsets(t, p.journal)
			tt.damage(t, p, offs)
			before := existing(t, path)

			_, openErr := Open(path, Options{})
			_, roErr := ReadOnly(path)
			for name, err := range map[string]error{"Open": openErr, "ReadOnly": roErr} {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("%s error = %v, want ErrCorrupt", name, err)
				}
				if !strings.Contains(err.Error(), tt.contains) {
					t.Errorf("%s error %q does not mention %q", name, err, tt.contains)
				}
				if tt.file == nil {
					continue
				}
				var ce *CorruptError
				if !errors.As(err, &ce) {
					t.Fatalf("%s error %v is not a *CorruptError", name, err)
				}
				want := &CorruptError{Path: tt.file(p), Offset: tt.offset(offs), Recoverable: tt.recoverable}
				if diff := cmp.Diff(want, ce, cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Reason" }, cmp.Ignore())); diff != "" {
					t.Errorf("%s CorruptError (-want +got):\n%s", name, diff)
				}
				wantMsg := fmt.Sprintf("state file %s is corrupt at offset %d: ", want.Path, want.Offset)
				if !strings.Contains(err.Error(), wantMsg) {
					t.Errorf("%s error %q lacks %q", name, err, wantMsg)
				}
			}
			if diff := cmp.Diff(before, existing(t, path)); diff != "" {
				t.Errorf("a failed Open changed the files (-before +after):\n%s", diff)
			}
		})
	}
}

func TestSecondWriterIsRefused(t *testing.T) {
	path := statePath(t)
	f := mustOpen(t, path, Options{})
	mustApply(t, f, put("m/a", "1"))

	_, err := Open(path, Options{})
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open error = %v, want ErrLocked", err)
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name the path %s", err, path)
	}
	// A reader is not a writer.
	if _, err := ReadOnly(path); err != nil {
		t.Errorf("ReadOnly while locked: %v", err)
	}
	mustClose(t, f)
	g := mustOpen(t, path, Options{})
	defer mustClose(t, g)
	if diff := cmp.Diff(bytesMap(map[string]string{"m/a": "1"}), g.Snapshot(), asStrings); diff != "" {
		t.Errorf("after the first writer closed (-want +got):\n%s", diff)
	}
}

func TestFileModes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new", "dir")
	path := filepath.Join(dir, "state")
	f := mustOpen(t, path, Options{CompactBytes: 1})
	mustApply(t, f, put("m/a", "1"))
	mustApply(t, f, put("m/b", "2")) // triggers a compaction: .next exists meanwhile
	mustClose(t, f)

	got := map[string]fs.FileMode{}
	st, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	got["new/dir"] = st.Mode().Perm()
	for _, name := range existing(t, path) {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		got[name] = st.Mode().Perm()
	}
	want := map[string]fs.FileMode{
		"new/dir":       0o700,
		"state.lock":    0o600,
		"state.snap":    0o600,
		"state.journal": 0o600,
		"state.mark":    0o600,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("modes (-want +got):\n%s", diff)
	}
}

func TestCompactionKeepsEverything(t *testing.T) {
	path := statePath(t)
	var commits, records int
	var mu sync.Mutex
	f := mustOpen(t, path, Options{
		CompactBytes: 8 << 10,
		OnCommit: func(r, _ int, _ time.Duration) {
			mu.Lock()
			commits++
			records += r
			mu.Unlock()
		},
	})
	const writers, each = 4, 300
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				k := fmt.Sprintf("m/%d/%d", w, i%50)
				ops := []Op{put(k, fmt.Sprintf(`{"w":%d,"i":%d,"pad":"%s"}`, w, i, strings.Repeat("z", 100)))}
				if i%10 == 9 {
					ops = append(ops, del(fmt.Sprintf("m/%d/%d", w, (i-5)%50)))
				}
				if err := f.Wait(context.Background(), f.Apply(ops...)); err != nil {
					t.Errorf("Wait: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	want := f.Snapshot()
	f.mu.Lock()
	gen := f.snapGen
	f.mu.Unlock()
	// The journal alone would be ~150 KiB; compaction keeps the files near
	// the state's size.
	size := f.Size()
	mustClose(t, f)

	if gen < 5 {
		t.Errorf("snapshot generation %d after ~150 KiB of journal at an 8 KiB threshold; compaction did not run", gen)
	}
	if size > 64<<10 {
		t.Errorf("Size() = %d bytes, want under 64 KiB for a state of 200 keys", size)
	}
	if records != writers*each {
		t.Errorf("OnCommit saw %d records in %d commits, want %d", records, commits, writers*each)
	}
	if diff := cmp.Diff(want, reopen(t, path), asStrings); diff != "" {
		t.Errorf("after reopen (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"state.journal", "state.lock", "state.mark", "state.snap"}, existing(t, path)); diff != "" {
		t.Errorf("files after close (-want +got):\n%s", diff)
	}
}

func TestConcurrentApplyWait(t *testing.T) {
	path := statePath(t)
	f := mustOpen(t, path, Options{CompactBytes: 64 << 10})
	const clients, each = 16, 100
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := range each {
				seq := f.Apply(put(fmt.Sprintf("m/%d/%d", c, i), fmt.Sprint(i)), put(fmt.Sprintf("meta/%d", c), fmt.Sprint(i)))
				if err := f.Wait(context.Background(), seq); err != nil {
					t.Errorf("client %d: Wait(%d): %v", c, seq, err)
					return
				}
			}
		})
	}
	wg.Wait()
	mustClose(t, f)
	want := map[string][]byte{}
	for c := range clients {
		for i := range each {
			want[fmt.Sprintf("m/%d/%d", c, i)] = []byte(fmt.Sprint(i))
		}
		want[fmt.Sprintf("meta/%d", c)] = []byte(fmt.Sprint(each - 1))
	}
	if diff := cmp.Diff(want, reopen(t, path), asStrings); diff != "" {
		t.Errorf("after reopen (-want +got):\n%s", diff)
	}
}

func TestFailureIsSticky(t *testing.T) {
	path := statePath(t)
	f := mustOpen(t, path, Options{})
	first := mustApply(t, f, put("m/a", "1"))
	// Pull the journal out from under the committer: the next write fails.
	f.journal.Close()
	seq := f.Apply(put("m/b", "2"))
	err := f.Wait(context.Background(), seq)
	if err == nil {
		t.Fatal("Wait succeeded on a closed journal")
	}
	for name, got := range map[string]error{
		"Healthy":           f.Healthy(),
		"Wait(later)":       f.Wait(context.Background(), f.Apply(put("m/c", "3"))),
		"Wait(same, again)": f.Wait(context.Background(), seq),
	} {
		if got == nil || got.Error() != err.Error() {
			t.Errorf("%s = %v, want the failure %v", name, got, err)
		}
	}
	// A record durable before the failure stays acknowledged: Open
	// replays it.
	if got := f.Wait(context.Background(), first); got != nil {
		t.Errorf("Wait(first) = %v, want nil: it was durable before the failure", got)
	}
	if cerr := f.Close(); cerr == nil || !strings.Contains(cerr.Error(), err.Error()) {
		t.Errorf("Close = %v, want it to report %v", cerr, err)
	}
	// Only the acknowledged record is on disk.
	if diff := cmp.Diff(bytesMap(map[string]string{"m/a": "1"}), reopen(t, path), asStrings); diff != "" {
		t.Errorf("after reopen (-want +got):\n%s", diff)
	}
}

func TestWait(t *testing.T) {
	path := statePath(t)
	release := make(chan struct{})
	var once sync.Once
	f := mustOpen(t, path, Options{OnCommit: func(int, int, time.Duration) {
		once.Do(func() { <-release }) // hold the marker after the first commit
	}})
	first := f.Apply(put("m/a", "1"))
	if err := f.Wait(context.Background(), first); err != nil {
		t.Fatalf("Wait(first): %v", err)
	}
	second := f.Apply(put("m/b", "2"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := f.Wait(ctx, second); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait while the marker is held = %v, want DeadlineExceeded", err)
	}
	if err := f.Wait(context.Background(), second+1); err == nil {
		t.Errorf("Wait for an unissued record succeeded")
	}
	if got := f.Apply(); got != second {
		t.Errorf("Apply() = %d, want the latest sequence %d", got, second)
	}
	close(release)
	if err := f.Wait(context.Background(), second); err != nil {
		t.Errorf("Wait after release: %v", err)
	}
	if err := f.Healthy(); err != nil {
		t.Errorf("Healthy: %v", err)
	}
	mustClose(t, f)
	late := f.Apply(put("m/c", "3"))
	if err := f.Wait(context.Background(), late); !errors.Is(err, ErrClosed) {
		t.Errorf("Wait for a record applied after Close = %v, want ErrClosed", err)
	}
	if err := f.Wait(context.Background(), second); err != nil {
		t.Errorf("Wait for a durable record after Close = %v, want nil", err)
	}
	if err := f.Healthy(); !errors.Is(err, ErrClosed) {
		t.Errorf("Healthy after Close = %v, want ErrClosed", err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestMemory(t *testing.T) {
	m := NewMemory(map[string][]byte{"m/a": []byte("1")})
	seq := m.Apply(put("m/b", "22"), del("m/a"))
	if err := m.Wait(context.Background(), seq); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if diff := cmp.Diff(bytesMap(map[string]string{"m/b": "22"}), m.Snapshot(), asStrings); diff != "" {
		t.Errorf("Snapshot (-want +got):\n%s", diff)
	}
	if got := m.Size(); got != 5 {
		t.Errorf("Size = %d, want 5", got)
	}
	mustClose(t, m)
	late := m.Apply(put("m/c", "3"))
	if err := m.Wait(context.Background(), late); !errors.Is(err, ErrClosed) {
		t.Errorf("Wait after Close = %v, want ErrClosed", err)
	}
	if err := m.Healthy(); !errors.Is(err, ErrClosed) {
		t.Errorf("Healthy after Close = %v, want ErrClosed", err)
	}
}

func TestReadOnlyMissingState(t *testing.T) {
	_, err := ReadOnly(statePath(t))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadOnly of nothing = %v, want fs.ErrNotExist", err)
	}
}
