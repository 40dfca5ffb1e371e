package statefile

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Format 1 as the previous release (commit 1f51497) wrote it, encoded here
// independently of the production encoder: the same 32-byte header (with
// version 1) and 12-byte frame header, but no start, seal or meta frames.
// testdata/v1 holds states that release wrote itself (see its README);
// TestV1EncoderMatchesPreviousRelease proves this encoder reproduces them
// byte for byte.

var v1CRC = crc32.MakeTable(crc32.Castagnoli)

func v1Header(kind byte, gen, count uint64) []byte {
	b := make([]byte, 32)
	copy(b, "BFSTATE\x00")
	binary.LittleEndian.PutUint16(b[8:], 1)
	b[10] = kind
	binary.LittleEndian.PutUint64(b[12:], gen)
	binary.LittleEndian.PutUint64(b[20:], count)
	binary.LittleEndian.PutUint32(b[28:], crc32.Checksum(b[:28], v1CRC))
	return b
}

func v1Frame(payload []byte) []byte {
	b := make([]byte, 12, 12+len(payload))
	binary.LittleEndian.PutUint32(b[0:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(b[4:], crc32.Checksum(payload, v1CRC))
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b[:8], v1CRC))
	return append(b, payload...)
}

func v1Str(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// v1Commit is one group commit frame holding one record per Apply call.
func v1Commit(records ...[]Op) []byte {
	var b []byte
	for _, ops := range records {
		b = binary.AppendUvarint(b, uint64(len(ops)))
		for _, op := range ops {
			if op.Delete {
				b = v1Str(append(b, 2), op.Key)
			} else {
				b = v1Str(v1Str(append(b, 1), op.Key), string(op.Value))
			}
		}
	}
	return v1Frame(b)
}

func v1Journal(gen uint64, commits ...[]byte) []byte {
	return slices.Concat(append([][]byte{v1Header('J', gen, 0)}, commits...)...)
}

// v1Snapshot holds the pairs kv (key, value, key, value...) in one frame,
// in that order; format 1 wrote no frame for an empty state.
func v1Snapshot(gen uint64, kv ...string) []byte {
	b := v1Header('S', gen, uint64(len(kv)/2))
	if len(kv) == 0 {
		return b
	}
	var payload []byte
	for i := 0; i+1 < len(kv); i += 2 {
		payload = v1Str(v1Str(payload, kv[i]), kv[i+1])
	}
	return append(b, v1Frame(payload)...)
}

// v2Snapshot and v2Journal build format-2 files with the production
// encoder, for states an upgrade leaves half done.
func v2Snapshot(gen uint64, journalMin int64, kv ...string) []byte {
	b := fileHeader{version: formatVersion, kind: kindSnapshot, gen: gen, count: uint64(len(kv) / 2)}.encode()
	b = append(b, frame(metaPayload(journalMin))...)
	var payload []byte
	for i := 0; i+1 < len(kv); i += 2 {
		payload = appendBytes(appendBytes(payload, kv[i]), kv[i+1])
	}
	if len(payload) > 0 {
		b = append(b, frame(payload)...)
	}
	return b
}

func v2Journal(gen uint64, records ...[]Op) []byte {
	b := journalStart(gen)
	for _, ops := range records {
		b = append(b, frame(appendRecord(nil, ops))...)
	}
	return b
}

// emptyJournal is the length of a journal of gen holding no records.
func emptyJournal(gen uint64) int64 { return int64(len(journalStart(gen))) }

// stateFiles are a state's snapshot, journal and next journal; nil is
// absent.
type stateFiles struct{ snap, journal, next []byte }

func (s stateFiles) write(t testing.TB, path string) {
	t.Helper()
	p := pathsFor(path)
	for _, f := range []struct {
		path string
		b    []byte
	}{{p.snap, s.snap}, {p.journal, s.journal}, {p.next, s.next}} {
		if f.b == nil {
			continue
		}
		if err := os.WriteFile(f.path, f.b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func readStateFiles(t testing.TB, path string) stateFiles {
	t.Helper()
	read := func(p string) []byte {
		b, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	p := pathsFor(path)
	return stateFiles{read(p.snap), read(p.journal), read(p.next)}
}

// The records of the states in testdata/v1, which the previous release
// wrote: m/a=1; m/b=2 m/c=3; -m/a -m/c; compaction to generation 2;
// m/d=4; m/b=22 -m/d; m/e=5; -m/e; then a compaction to generation 3
// paused after the switch, with m/e="" and m/f={"n":6} in the new journal.
var (
	v1Snap2    = v1Snapshot(2, "m/b", "2")
	v1Frames2  = [][]byte{v1Commit([]Op{put("m/d", "4")}), v1Commit([]Op{put("m/b", "22"), del("m/d")}), v1Commit([]Op{put("m/e", "5")}), v1Commit([]Op{del("m/e")})}
	v1Journal2 = v1Journal(2, v1Frames2...)
	v1Next3    = v1Journal(3, v1Commit([]Op{put("m/e", "")}), v1Commit([]Op{put("m/f", `{"n":6}`)}))
)

// v1Golden is testdata/v1 as v1Commit and friends encode it.
var v1Golden = map[string]stateFiles{
	"compacted":          {v1Snap2, v1Journal2, nil},
	"two-journals":       {v1Snap2, v1Journal2, v1Next3},
	"snapshot-installed": {v1Snapshot(3, "m/b", "22"), v1Journal2, v1Next3},
}

// goldenWant is the state the previous release held when it left
// testdata/v1/name.
func goldenWant(t testing.TB, name string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "v1", name, "want.json"))
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]string
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	return want
}

func TestV1EncoderMatchesPreviousRelease(t *testing.T) {
	for name, want := range v1Golden {
		t.Run(name, func(t *testing.T) {
			got := readStateFiles(t, filepath.Join("testdata", "v1", name, "state"))
			for _, f := range []struct {
				name      string
				got, want []byte
			}{{"snap", got.snap, want.snap}, {"journal", got.journal, want.journal}, {"next", got.next, want.next}} {
				if !bytes.Equal(f.got, f.want) {
					t.Errorf("%s: the previous release wrote\n%x\nthe test encoder writes\n%x", f.name, f.got, f.want)
				}
			}
		})
	}
}

// upgradeLogs counts the Info records that report an upgrade from format 1.
func upgradeLogs(t *testing.T, logs *bytes.Buffer) int {
	t.Helper()
	n := 0
	for line := range strings.Lines(logs.String()) {
		var rec struct {
			Level, Msg string
			From       int `json:"from_format"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec.Msg == "state upgraded" {
			if rec.Level != "INFO" || rec.From != 1 {
				t.Errorf("upgrade logged as %s from format %d, want INFO from format 1", rec.Level, rec.From)
			}
			n++
		}
	}
	return n
}

// fileVersions maps each file next to path (but the lock) to the format
// version in its header.
func fileVersions(t *testing.T, path string) map[string]uint16 {
	t.Helper()
	out := map[string]uint16{}
	for _, name := range existing(t, path) {
		if strings.HasSuffix(name, ".lock") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(filepath.Dir(path), name))
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 10 {
			t.Fatalf("%s: %d bytes, no header", name, len(b))
		}
		out[name] = binary.LittleEndian.Uint16(b[8:])
	}
	return out
}

// TestOpenUpgradesFormat1 opens states the previous release left, including
// mid-compaction and with torn tails: ReadOnly reads them unchanged, and
// Open recovers exactly the acknowledged records, leaves a format-2 state
// and logs the upgrade once.
func TestOpenUpgradesFormat1(t *testing.T) {
	compacted, twoJournals := v1Golden["compacted"], v1Golden["two-journals"]
	lastFrame := len(compacted.journal) - len(v1Frames2[3])
	tests := []struct {
		name  string
		files stateFiles
		want  map[string]string
	}{
		{"compacted", compacted, goldenWant(t, "compacted")},
		{
			name:  "torn tail: the last frame half written",
			files: stateFiles{compacted.snap, compacted.journal[:lastFrame+15], nil},
			want:  map[string]string{"m/b": "22", "m/e": "5"},
		},
		{
			name:  "torn tail: part of a frame header",
			files: stateFiles{compacted.snap, append(slices.Clone(compacted.journal), 9, 0, 0), nil},
			want:  goldenWant(t, "compacted"),
		},
		{"mid-compaction: two journals", twoJournals, goldenWant(t, "two-journals")},
		{
			name:  "mid-compaction: two journals, the next one torn",
			files: stateFiles{twoJournals.snap, twoJournals.journal, twoJournals.next[:len(twoJournals.next)-3]},
			want:  map[string]string{"m/b": "22", "m/e": ""},
		},
		{"mid-compaction: snapshot installed, next not renamed", v1Golden["snapshot-installed"], goldenWant(t, "snapshot-installed")},
		{"new state", stateFiles{v1Snapshot(1), v1Journal(1), nil}, map[string]string{}},
		{
			// Format 1 created a state, and redid a compaction, snapshot
			// first; a crash before the journal leaves the snapshot alone.
			name:  "snapshot without a journal",
			files: stateFiles{v1Snapshot(5, "m/a", "1", "m/b", ""), nil, nil},
			want:  map[string]string{"m/a": "1", "m/b": ""},
		},
		{
			name:  "a redone compaction left both journals stale",
			files: stateFiles{v1Snapshot(4, "m/a", "1"), v1Journal2, v1Next3},
			want:  map[string]string{"m/a": "1"},
		},
		{
			name:  "a redone compaction left a stale next journal",
			files: stateFiles{v1Snapshot(4, "m/a", "1"), v1Journal(4, v1Commit([]Op{put("m/b", "2")}, []Op{del("m/a")})), v1Next3},
			want:  map[string]string{"m/b": "2"},
		},
		{
			name:  "an empty frame, which format 1 read as no records",
			files: stateFiles{v1Snap2, v1Journal(2, v1Frame(nil), v1Frames2[0]), nil},
			want:  map[string]string{"m/b": "2", "m/d": "4"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := statePath(t)
			tt.files.write(t, path)
			want := bytesMap(tt.want)

			got, err := ReadOnly(path)
			if err != nil {
				t.Fatalf("ReadOnly: %v", err)
			}
			if diff := cmp.Diff(want, got, asStrings); diff != "" {
				t.Errorf("ReadOnly (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.files, readStateFiles(t, path), cmp.AllowUnexported(stateFiles{})); diff != "" {
				t.Errorf("ReadOnly changed the files (-before +after):\n%s", diff)
			}

			var logs bytes.Buffer
			log := slog.New(slog.NewJSONHandler(&logs, nil))
			f := mustOpen(t, path, Options{Logger: log})
			if diff := cmp.Diff(want, f.Snapshot(), asStrings); diff != "" {
				t.Errorf("Open (-want +got):\n%s", diff)
			}
			if n := upgradeLogs(t, &logs); n != 1 {
				t.Errorf("Open logged the upgrade %d times, want once:\n%s", n, logs.String())
			}
			wantFiles := map[string]uint16{"state.journal": formatVersion, "state.snap": snapshotVersion, "state.mark": markVersion}
			if diff := cmp.Diff(wantFiles, fileVersions(t, path)); diff != "" {
				t.Errorf("files after the upgrade (-want +got):\n%s", diff)
			}
			mustApply(t, f, put("m/after", "1"))
			mustClose(t, f)

			logs.Reset()
			want["m/after"] = []byte("1")
			g := mustOpen(t, path, Options{Logger: log})
			if diff := cmp.Diff(want, g.Snapshot(), asStrings); diff != "" {
				t.Errorf("reopen (-want +got):\n%s", diff)
			}
			mustClose(t, g)
			if n := upgradeLogs(t, &logs); n != 0 {
				t.Errorf("reopening an upgraded state logged %d upgrades", n)
			}
		})
	}
}

// TestFormat1CorruptionIsAnError holds format-1 states to the previous
// release's rules: only the newest journal's torn tail is dropped, and
// every other fault is a *CorruptError naming file and offset.
func TestFormat1CorruptionIsAnError(t *testing.T) {
	frameAt := func(i int) int64 { // offset of v1Frames2[i] in v1Journal2
		off := int64(headerSize)
		for _, f := range v1Frames2[:i] {
			off += int64(len(f))
		}
		return off
	}
	flipped := slices.Clone(v1Journal2)
	flipped[frameAt(1)+frameHeaderSize+1] ^= 1
	tests := []struct {
		name     string
		files    stateFiles
		file     func(p paths) string
		offset   int64
		contains string
	}{
		{
			name:     "payload byte flipped in a middle frame",
			files:    stateFiles{v1Snap2, flipped, nil},
			file:     func(p paths) string { return p.journal },
			offset:   frameAt(1),
			contains: "frame checksum mismatch",
		},
		{
			name:     "torn tail in the older of two journals",
			files:    stateFiles{v1Snap2, v1Journal2[:len(v1Journal2)-2], v1Next3},
			file:     func(p paths) string { return p.journal },
			offset:   frameAt(3),
			contains: "extends past the end of the file",
		},
		{
			name:     "journal continues a generation whose journal is missing",
			files:    stateFiles{v1Snap2, nil, v1Next3},
			file:     func(p paths) string { return p.next },
			offset:   12,
			contains: "no journal of generation 2 exists",
		},
		{
			name:     "journal ahead of the snapshot",
			files:    stateFiles{v1Snap2, v1Journal(4), nil},
			file:     func(p paths) string { return p.journal },
			offset:   12,
			contains: "is ahead of snapshot",
		},
		{
			name:     "two journals of one generation",
			files:    stateFiles{v1Snap2, v1Journal2, v1Journal(2)},
			file:     func(p paths) string { return p.next },
			offset:   12,
			contains: "duplicates",
		},
		{
			name:     "snapshot entry count",
			files:    stateFiles{append(v1Header('S', 2, 2), v1Snap2[headerSize:]...), v1Journal2, nil},
			file:     func(p paths) string { return p.snap },
			offset:   int64(len(v1Snap2)),
			contains: "header says 2",
		},
		{
			// Format 1 has no control frames: what format 2 reads as a
			// seal is a record without ops there.
			name:     "a format-2 control frame in a format-1 journal",
			files:    stateFiles{v1Snap2, v1Journal(2, v1Frames2[0], controlFrame(ctlSeal, 3)), nil},
			file:     func(p paths) string { return p.journal },
			offset:   frameAt(1),
			contains: "record with no ops",
		},
		{
			name:     "journal without a snapshot",
			files:    stateFiles{nil, v1Journal2, nil},
			file:     func(p paths) string { return p.snap },
			offset:   0,
			contains: "the snapshot is missing",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkCorrupt(t, tt.files, tt.file, tt.offset, tt.contains)
		})
	}
}

// checkCorrupt expects Open and ReadOnly to refuse files with a
// *CorruptError at file and offset, and Open to leave them as they were.
func checkCorrupt(t *testing.T, files stateFiles, file func(p paths) string, offset int64, contains string) {
	t.Helper()
	path := statePath(t)
	files.write(t, path)
	names := existing(t, path)
	p := pathsFor(path)
	_, openErr := Open(path, Options{})
	_, roErr := ReadOnly(path)
	for name, err := range map[string]error{"Open": openErr, "ReadOnly": roErr} {
		var ce *CorruptError
		if !errors.As(err, &ce) {
			t.Fatalf("%s error = %v, want a *CorruptError", name, err)
		}
		if !strings.Contains(err.Error(), contains) {
			t.Errorf("%s error %q does not mention %q", name, err, contains)
		}
		if ce.Path != file(p) || ce.Offset != offset {
			t.Errorf("%s error at %s offset %d, want %s offset %d: %v", name, ce.Path, ce.Offset, file(p), offset, err)
		}
	}
	if diff := cmp.Diff(files, readStateFiles(t, path), cmp.AllowUnexported(stateFiles{})); diff != "" {
		t.Errorf("a failed Open changed the files (-before +after):\n%s", diff)
	}
	before := slices.DeleteFunc(existing(t, path), func(n string) bool { return n == "state.lock" })
	if diff := cmp.Diff(names, before); diff != "" {
		t.Errorf("a failed Open changed the file names (-before +after):\n%s", diff)
	}
}

// TestMixedFormatsNotFromAnUpgrade refuses every mix of format-1 and
// format-2 files that the upgrade never leaves.
func TestMixedFormatsNotFromAnUpgrade(t *testing.T) {
	snap5 := v2Snapshot(5, emptyJournal(5), "m/b", "22")
	tests := []struct {
		name     string
		files    stateFiles
		file     func(p paths) string
		offset   int64
		contains string
	}{
		{
			name:     "format-2 journal beside a format-1 snapshot",
			files:    stateFiles{v1Snap2, v2Journal(3), nil},
			file:     func(p paths) string { return p.journal },
			offset:   8,
			contains: "not a state an upgrade leaves",
		},
		{
			name:     "format-2 next journal with records beside a format-1 snapshot",
			files:    stateFiles{v1Snap2, v1Journal2, v2Journal(3, []Op{put("m/x", "1")})},
			file:     func(p paths) string { return p.next },
			offset:   headerSize,
			contains: "holds more than its start frame",
		},
		{
			name:     "format-2 next journal not above the format-1 generations",
			files:    stateFiles{v1Snap2, v1Journal2, v2Journal(2)},
			file:     func(p paths) string { return p.next },
			offset:   12,
			contains: "not a state an upgrade leaves",
		},
		{
			name:     "format-1 journal alone beside a format-2 snapshot",
			files:    stateFiles{snap5, v1Journal2, nil},
			file:     func(p paths) string { return p.journal },
			offset:   8,
			contains: "(journal format 1, next absent)",
		},
		{
			name:     "format-1 next journal beside a format-2 journal",
			files:    stateFiles{snap5, v2Journal(5), v1Next3},
			file:     func(p paths) string { return p.next },
			offset:   8,
			contains: "(journal format 2, next format 1)",
		},
		{
			name:     "the upgrade's journal holds records",
			files:    stateFiles{snap5, v1Journal2, v2Journal(5, []Op{put("m/x", "1")})},
			file:     func(p paths) string { return p.journal },
			offset:   8,
			contains: "not a state an upgrade leaves",
		},
		{
			name:     "format-2 snapshot promising records beside format-1 journals",
			files:    stateFiles{v2Snapshot(5, emptyJournal(5)+20, "m/b", "22"), v1Journal2, v1Next3},
			file:     func(p paths) string { return p.snap },
			offset:   headerSize,
			contains: "an upgrade's snapshot records an empty journal",
		},
		{
			name:     "format-1 journal of the snapshot's generation",
			files:    stateFiles{v2Snapshot(2, emptyJournal(2), "m/b", "22"), v1Journal2, v1Next3},
			file:     func(p paths) string { return p.journal },
			offset:   12,
			contains: "not a state an upgrade leaves",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkCorrupt(t, tt.files, tt.file, tt.offset, tt.contains)
		})
	}
}

// TestCrashDuringUpgrade copies the files at every step of an upgrade, as
// kill -9 or power loss there would leave them, and recovers each copy;
// then it crashes the Open that finishes each interrupted upgrade at every
// step too. Every copy holds the complete format-1 or format-2 state.
func TestCrashDuringUpgrade(t *testing.T) {
	type versions = map[string]uint16
	journalFirst := map[string]versions{
		"upgrade-started":            {"state.snap": 1, "state.journal": 1},
		"upgrade-journal-created":    {"state.snap": 1, "state.journal": 1, "state.journal.next": 2},
		"snapshot-written":           {"state.snap": 1, "state.journal": 1, "state.journal.next": 2, "state.mark": 1, "state.snap.tmp": 3},
		"upgrade-snapshot-installed": {"state.snap": 3, "state.journal": 1, "state.journal.next": 2, "state.mark": 1},
		"upgraded":                   {"state.snap": 3, "state.journal": 2, "state.mark": 1},
	}
	snapshotFirst := map[string]versions{
		"upgrade-started":            {"state.snap": 1, "state.journal": 1, "state.journal.next": 1},
		"snapshot-written":           {"state.snap": 1, "state.journal": 1, "state.journal.next": 1, "state.mark": 1, "state.snap.tmp": 3},
		"upgrade-snapshot-installed": {"state.snap": 3, "state.journal": 1, "state.journal.next": 1, "state.mark": 1},
		"upgrade-journal-created":    {"state.snap": 3, "state.journal": 1, "state.journal.next": 2, "state.mark": 1},
		"upgraded":                   {"state.snap": 3, "state.journal": 2, "state.mark": 1},
	}
	tests := []struct {
		name  string
		files stateFiles
		want  map[string]string
		steps map[string]versions
	}{
		{"one journal", v1Golden["compacted"], goldenWant(t, "compacted"), journalFirst},
		{"two journals", v1Golden["two-journals"], goldenWant(t, "two-journals"), snapshotFirst},
		{"next journal not renamed", v1Golden["snapshot-installed"], goldenWant(t, "snapshot-installed"), snapshotFirst},
		{
			name:  "snapshot alone",
			files: stateFiles{v1Snapshot(5, "m/a", "1"), nil, nil},
			want:  map[string]string{"m/a": "1"},
			steps: map[string]versions{
				"upgrade-started":            {"state.snap": 1},
				"upgrade-journal-created":    {"state.snap": 1, "state.journal.next": 2},
				"snapshot-written":           {"state.snap": 1, "state.journal.next": 2, "state.mark": 1, "state.snap.tmp": 3},
				"upgrade-snapshot-installed": {"state.snap": 3, "state.journal.next": 2, "state.mark": 1},
				"upgraded":                   {"state.snap": 3, "state.journal": 2, "state.mark": 1},
			},
		},
	}
	defer func() { testHook = nil }()
	// crashAt opens path and returns a copy of the files at every step.
	crashAt := func(t *testing.T, path string) (map[string]string, []string) {
		t.Helper()
		images := map[string]string{}
		var order []string
		testHook = func(step string) {
			if step != "opened-journal" {
				images[step] = copyState(t, path)
				order = append(order, step)
			}
		}
		f := mustOpen(t, path, Options{})
		testHook = nil
		mustClose(t, f)
		return images, order
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := bytesMap(tt.want)
			path := statePath(t)
			tt.files.write(t, path)
			images, order := crashAt(t, path)
			if len(order) != len(tt.steps) {
				t.Errorf("upgrade steps %v, want %d of them", order, len(tt.steps))
			}
			for step, wantVersions := range tt.steps {
				image, ok := images[step]
				if !ok {
					t.Errorf("the upgrade never reached %q", step)
					continue
				}
				if diff := cmp.Diff(wantVersions, fileVersions(t, image)); diff != "" {
					t.Errorf("files at %s (-want +got):\n%s", step, diff)
				}
			}
			for _, step := range order {
				t.Run(step, func(t *testing.T) {
					image := images[step]
					hasV1 := false
					for name, v := range fileVersions(t, image) {
						hasV1 = hasV1 || v == 1 && name != "state.mark"
					}
					// Crash the Open that finishes this upgrade at each of
					// its steps.
					resumed, steps := crashAt(t, copyState(t, image))
					for _, s := range steps {
						t.Run("then "+s, func(t *testing.T) { checkRecovers(t, resumed[s], want) })
					}
					if hasV1 && len(steps) == 0 {
						t.Errorf("Open of a state with format-1 files did not upgrade it")
					}

					var logs bytes.Buffer
					f := mustOpen(t, copyState(t, image), Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
					mustClose(t, f)
					// An upgrade whose last format-1 file is gone looks like
					// a compaction before its rename, and is finished as one.
					if n, wantN := upgradeLogs(t, &logs), map[bool]int{true: 1, false: 0}[hasV1]; n != wantN {
						t.Errorf("finishing the upgrade logged it %d times, want %d", n, wantN)
					}

					checkRecovers(t, image, want)
				})
			}
		})
	}
}

// TestReadOnlyRacingUpgrade stops ReadOnly after it opened the format-1
// snapshot and journal, and lets Open upgrade the state meanwhile: without
// the replaced-file check it would miss the records of the next journal.
func TestReadOnlyRacingUpgrade(t *testing.T) {
	path := statePath(t)
	v1Golden["two-journals"].write(t, path)
	var stopped atomic.Bool
	paused, resume := make(chan struct{}), make(chan struct{})
	testHook = func(step string) {
		if step == "opened-journal" && stopped.CompareAndSwap(false, true) {
			close(paused)
			<-resume
		}
	}
	defer func() { testHook = nil }()
	type result struct {
		state map[string][]byte
		err   error
	}
	read := make(chan result, 1)
	go func() {
		s, err := ReadOnly(path)
		read <- result{s, err}
	}()
	<-paused
	f := mustOpen(t, path, Options{})
	close(resume)
	got := <-read
	if got.err != nil {
		t.Fatalf("ReadOnly: %v", got.err)
	}
	want := bytesMap(goldenWant(t, "two-journals"))
	if diff := cmp.Diff(want, got.state, asStrings); diff != "" {
		t.Errorf("ReadOnly (-want +got):\n%s", diff)
	}
	mustApply(t, f, put("m/after", "1"))
	mustClose(t, f)
}

// TestUpgradeKeepsOneWriter checks that the upgrade runs under the lock
// and that the journal it creates is locked like any other.
func TestUpgradeKeepsOneWriter(t *testing.T) {
	path := statePath(t)
	v1Golden["two-journals"].write(t, path)
	f := mustOpen(t, path, Options{})
	defer mustClose(t, f)
	if err := os.Remove(pathsFor(path).lock); err != nil {
		t.Fatal(err)
	}
	if g, err := Open(path, Options{}); !errors.Is(err, ErrLocked) {
		if err == nil {
			g.Close()
		}
		t.Fatalf("second Open after the upgrade, lock file removed: %v, want ErrLocked", err)
	}
	if err := f.compactNow(context.Background()); err != nil {
		t.Fatalf("compaction after the upgrade: %v", err)
	}
	want := bytesMap(goldenWant(t, "two-journals"))
	if diff := cmp.Diff(want, f.Snapshot(), asStrings); diff != "" {
		t.Errorf("after compaction (-want +got):\n%s", diff)
	}
}
