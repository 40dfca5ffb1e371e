package statefile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fuzzState builds a small real state and returns its files' bytes (nil
// for absent). With midCompaction the files are those of a compaction
// paused after it sealed the old journal, with a record in the new one.
func fuzzState(f *testing.F, records int, midCompaction bool) (snap, journal, next, mark []byte) {
	path := filepath.Join(f.TempDir(), "state")
	s, err := Open(path, Options{NoSync: true, CompactBytes: -1})
	if err != nil {
		f.Fatal(err)
	}
	for i := range records {
		seq := s.Apply(put(fmt.Sprintf("m/%d", i%3), fmt.Sprint(i)), del(fmt.Sprintf("m/%d", (i+1)%3)))
		if err := s.Wait(context.Background(), seq); err != nil {
			f.Fatal(err)
		}
	}
	read := func(p string) []byte {
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	p := pathsFor(path)
	if midCompaction {
		steps := make(chan string)
		resume := make(chan struct{})
		testHook = func(step string) {
			if step != "opened-journal" {
				steps <- step
				<-resume
			}
		}
		done := make(chan error, 1)
		go func() { done <- s.compactNow(context.Background()) }()
		for step := range steps {
			if step == "rotated" {
				seq := s.Apply(put("m/next", "1"))
				if err := s.Wait(context.Background(), seq); err != nil {
					f.Fatal(err)
				}
				snap, journal, next, mark = read(p.snap), read(p.journal), read(p.next), read(p.mark)
			}
			resume <- struct{}{}
			if step == "snapshot-installed" {
				break
			}
		}
		testHook = nil
		if err := <-done; err != nil {
			f.Fatal(err)
		}
		s.Close()
		return snap, journal, next, mark
	}
	if err := s.Close(); err != nil {
		f.Fatal(err)
	}
	return read(p.snap), read(p.journal), read(p.next), read(p.mark)
}

// FuzzFrames feeds arbitrary bytes after a journal header to the frame
// reader and the journal replay: they must end (cleanly, torn or with a
// *CorruptError), never read past the file, and replaying the file cut
// at the end they reported must give the same state with no torn tail.
func FuzzFrames(f *testing.F) {
	_, journal, _, _ := fuzzState(f, 4, false)
	f.Add(journal[headerSize:])
	f.Add(journal[headerSize : len(journal)-3])
	f.Add([]byte{})
	f.Add(controlFrame(ctlStart, 1))
	f.Add(append(controlFrame(ctlStart, 1), controlFrame(ctlSeal, 2)...))
	f.Add(v1Journal2[headerSize:])
	f.Fuzz(func(t *testing.T, body []byte) {
		if len(body) > 1<<16 {
			return
		}
		const path = "fuzz.journal"
		file := append(fileHeader{kind: kindJournal, gen: 1}.encode(), body...)
		size := int64(len(file))

		fr := newFrameReader(path, bytes.NewReader(file), size)
		last := fr.off
		for {
			payload, fault, err := fr.next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("frame reader on an in-memory file: %v", err)
			}
			if fault != nil {
				if fault.off < headerSize || fault.off > size {
					t.Fatalf("fault at %d outside the file (%d bytes)", fault.off, size)
				}
				break
			}
			if fr.off <= last || fr.off > size || int64(len(payload)) != fr.off-last-frameHeaderSize {
				t.Fatalf("frame [%d, %d) with %d-byte payload in a %d-byte file", last, fr.off, len(payload), size)
			}
			last = fr.off
			// The payload decoders must not panic on anything.
			applyJournalPayload(payload, map[string][]byte{})
			applySnapshotPayload(payload, map[string][]byte{})
			parseControl(payload)
			parseMeta(payload)
		}

		// A format-1 journal replays under the same contract, with no
		// control frames.
		legacy := map[string][]byte{}
		if info, err := replayLegacyJournal(path, bytes.NewReader(file), size, 1, legacy, true); err != nil {
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Path != path || ce.Offset < 0 || ce.Offset > size {
				t.Fatalf("format-1 replay error %v is not a *CorruptError within the file", err)
			}
		} else {
			if info.end < headerSize || info.end > size || (info.end < size) != (info.tear != "") {
				t.Fatalf("format-1 replay ended at %d of %d with tear %q", info.end, size, info.tear)
			}
			again := map[string][]byte{}
			cut, err := replayLegacyJournal(path, bytes.NewReader(file[:info.end]), info.end, 1, again, false)
			if err != nil {
				t.Fatalf("format-1 replay of the file cut at its end %d: %v", info.end, err)
			}
			if cut.tear != "" || cut.records != info.records {
				t.Fatalf("format-1 cut replay %+v differs from %+v", cut, info)
			}
			if diff := cmp.Diff(legacy, again, asStrings); diff != "" {
				t.Fatalf("format-1 cut replay state (-first +cut):\n%s", diff)
			}
		}

		state := map[string][]byte{}
		info, err := replayJournal(path, bytes.NewReader(file), size, 1, state, promised{}, acked{})
		if err == nil && info.damage != nil {
			err = info.damage
		}
		if err != nil {
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Path != path || ce.Offset < 0 || ce.Offset > size {
				t.Fatalf("replay error %v is not a *CorruptError within the file", err)
			}
			return
		}
		if info.end < headerSize || info.end > size || (info.end < size) != (info.tear != "") {
			t.Fatalf("replay ended at %d of %d with tear %q", info.end, size, info.tear)
		}
		again := map[string][]byte{}
		cut, err := replayJournal(path, bytes.NewReader(file[:info.end]), info.end, 1, again, promised{}, acked{})
		if err == nil && cut.damage != nil {
			err = cut.damage
		}
		if err != nil {
			t.Fatalf("replay of the file cut at its end %d: %v", info.end, err)
		}
		if cut.tear != "" || cut.records != info.records || cut.sealed != info.sealed {
			t.Fatalf("cut replay %+v differs from %+v", cut, info)
		}
		if diff := cmp.Diff(state, again, asStrings); diff != "" {
			t.Fatalf("cut replay state (-first +cut):\n%s", diff)
		}
	})
}

// FuzzRecover writes arbitrary bytes as a state's snapshot, journal and
// next journal (each present or not) and opens them. ReadOnly and Open
// must each return a state or an error matching ErrCorrupt, agree with
// each other, and a state Open returned must come back unchanged from a
// reopen (its repairs are final) and from ReadOnly.
func FuzzRecover(f *testing.F) {
	for _, s := range []struct {
		records int
		mid     bool
	}{{0, false}, {3, false}, {3, true}} {
		snap, journal, next, mark := fuzzState(f, s.records, s.mid)
		f.Add(snap, journal, next, mark, byte(15))
		f.Add(snap, journal, next, mark, byte(11))
		f.Add(snap, journal, next, mark, byte(7))
		// The last journal frame cut off: acknowledged, so corruption.
		f.Add(snap, journal[:len(journal)-3], next, mark, byte(15))
	}
	f.Add([]byte{}, journalStart(1), []byte{}, []byte{}, byte(2))
	// Format-1 states (see upgrade_test.go), one with a torn tail, and the
	// half-done upgrades of the one mid-compaction.
	for _, s := range v1Golden {
		f.Add(s.snap, s.journal, s.next, []byte{}, byte(7))
		f.Add(s.snap, s.journal, s.next, []byte{}, byte(3))
	}
	f.Add(v1Snap2, v1Journal2[:len(v1Journal2)-4], []byte{}, []byte{}, byte(3))
	f.Add(v1Snapshot(5, "m/a", "1"), []byte{}, []byte{}, []byte{}, byte(1))
	f.Add(v1Snap2, v1Journal2, v2Journal(3), []byte{}, byte(7))
	snap4 := v2Snapshot(4, emptyJournal(4), "m/b", "22", "m/e", "", "m/f", `{"n":6}`)
	f.Add(snap4, v1Journal2, v1Next3, []byte{}, byte(7))
	f.Add(snap4, v1Journal2, v2Journal(4), []byte{}, byte(7))
	old := readOnlyPolicy
	readOnlyPolicy.Initial, readOnlyPolicy.Max = time.Nanosecond, time.Nanosecond
	f.Cleanup(func() { readOnlyPolicy = old })
	f.Fuzz(func(t *testing.T, snap, journal, next, mark []byte, present byte) {
		if len(snap)+len(journal)+len(next)+len(mark) > 1<<18 {
			return
		}
		path := filepath.Join(t.TempDir(), "state")
		p := pathsFor(path)
		for i, file := range []struct {
			path string
			b    []byte
		}{{p.snap, snap}, {p.journal, journal}, {p.next, next}, {p.mark, mark}} {
			if present&(1<<i) == 0 {
				continue
			}
			if err := os.WriteFile(file.path, file.b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		ro, roErr := ReadOnly(path)
		if roErr != nil && !errors.Is(roErr, ErrCorrupt) && !errors.Is(roErr, fs.ErrNotExist) {
			t.Fatalf("ReadOnly error is neither corruption nor no state: %v", roErr)
		}
		s, err := Open(path, Options{NoSync: true, CompactBytes: -1})
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open error is not corruption: %v", err)
			}
			if !errors.Is(roErr, ErrCorrupt) {
				t.Fatalf("Open found corruption (%v) where ReadOnly found %v", err, roErr)
			}
			// Damage Recover can drop is dropped, for good.
			var ce *CorruptError
			if errors.As(err, &ce) && ce.Recoverable {
				r, err := Open(path, Options{NoSync: true, CompactBytes: -1, Recover: true})
				if err != nil {
					t.Fatalf("Open with Recover after %v: %v", ce, err)
				}
				if r.Recovered() == nil {
					t.Fatalf("Open with Recover after %v reports no recovery", ce)
				}
				recovered := r.Snapshot()
				r.Close()
				again, err := Open(path, Options{NoSync: true, CompactBytes: -1})
				if err != nil {
					t.Fatalf("Open after a recovery: %v", err)
				}
				if diff := cmp.Diff(recovered, again.Snapshot(), asStrings); diff != "" {
					t.Fatalf("Open after a recovery (-recovered +reopened):\n%s", diff)
				}
				again.Close()
			}
			return
		}
		got := s.Snapshot()
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		switch {
		case errors.Is(roErr, fs.ErrNotExist):
			if len(got) != 0 {
				t.Fatalf("Open recovered %d keys where ReadOnly found no state", len(got))
			}
		case roErr != nil:
			t.Fatalf("ReadOnly found corruption (%v) where Open recovered a state", roErr)
		default:
			if diff := cmp.Diff(ro, got, asStrings); diff != "" {
				t.Fatalf("ReadOnly and Open disagree (-readonly +open):\n%s", diff)
			}
		}
		s, err = Open(path, Options{NoSync: true, CompactBytes: -1})
		if err != nil {
			t.Fatalf("reopen after a successful Open: %v", err)
		}
		again := s.Snapshot()
		s.Close()
		if diff := cmp.Diff(got, again, asStrings); diff != "" {
			t.Fatalf("reopen (-first +second):\n%s", diff)
		}
		after, err := ReadOnly(path)
		if err != nil {
			t.Fatalf("ReadOnly after Open: %v", err)
		}
		if diff := cmp.Diff(got, after, asStrings); diff != "" {
			t.Fatalf("ReadOnly after Open (-open +readonly):\n%s", diff)
		}
	})
}

// FuzzDamage writes a real state from a script of records (with a
// compaction somewhere), then cuts its journal or flips bytes in it at a
// fuzzed place. Recovery must fail with ErrCorrupt or return the state
// after a prefix of the records that keeps every record whose frame lies
// wholly before the damage: nothing acknowledged ahead of a torn tail is
// ever dropped, and nothing is made up.
func FuzzDamage(f *testing.F) {
	f.Add([]byte("abcdefgh"), uint8(3), uint32(200), []byte{0xff}, false)
	f.Add([]byte("abcdefgh"), uint8(3), uint32(200), []byte{}, true)
	f.Add([]byte("a\x00b\x01c\x02d"), uint8(255), uint32(90), []byte{1, 2, 3}, false)
	f.Add([]byte("zz"), uint8(0), uint32(0), []byte{}, true)
	old := readOnlyPolicy
	readOnlyPolicy.Initial, readOnlyPolicy.Max = time.Nanosecond, time.Nanosecond
	f.Cleanup(func() { readOnlyPolicy = old })
	f.Fuzz(func(t *testing.T, script []byte, compactAfter uint8, at uint32, xor []byte, cut bool) {
		if len(script) > 64 || len(xor) > 64 {
			return
		}
		// Record i puts k/(b%5) = i, or deletes it when b is odd.
		states := []map[string][]byte{{}}
		path := filepath.Join(t.TempDir(), "state")
		s, err := Open(path, Options{NoSync: true, CompactBytes: -1})
		if err != nil {
			t.Fatal(err)
		}
		base := 0 // records in the snapshot
		for i, b := range script {
			op := put(fmt.Sprintf("k/%d", b%5), fmt.Sprint(i))
			if b%2 == 1 {
				op = del(op.Key)
			}
			if err := s.Wait(context.Background(), s.Apply(op)); err != nil {
				t.Fatal(err)
			}
			states = append(states, s.Snapshot())
			if i == int(compactAfter) {
				if err := s.compactNow(context.Background()); err != nil {
					t.Fatal(err)
				}
				base = i + 1
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		p := pathsFor(path)
		journal, err := os.ReadFile(p.journal)
		if err != nil {
			t.Fatal(err)
		}
		offs, size := frameOffsets(t, p.journal) // start frame, then one record per frame
		pos := int(at % uint32(len(journal)+1))
		damaged := false
		if cut {
			damaged = pos < len(journal)
			journal = journal[:pos]
		} else {
			for i, x := range xor {
				if pos+i < len(journal) && x != 0 {
					journal[pos+i] ^= x
					damaged = true
				}
			}
		}
		if err := os.WriteFile(p.journal, journal, 0o600); err != nil {
			t.Fatal(err)
		}
		// Every record frame that ends at or before pos is intact.
		intact := 0
		for i := 1; i < len(offs); i++ {
			end := size
			if i+1 < len(offs) {
				end = offs[i+1]
			}
			if !damaged || end <= int64(pos) {
				intact = i
			}
		}
		check := func(name string, got map[string][]byte, err error) {
			t.Helper()
			if err != nil {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("%s error is not corruption: %v", name, err)
				}
				return
			}
			for n := base + intact; n < len(states); n++ {
				if cmp.Diff(states[n], got, asStrings) == "" {
					return
				}
			}
			t.Fatalf("%s recovered a state that is not that of %d or more of the %d records (%d in the snapshot, %d intact in the journal): %v",
				name, base+intact, len(states)-1, base, intact, keys(got))
		}
		got, err := ReadOnly(path)
		check("ReadOnly", got, err)
		if s, err = Open(path, Options{NoSync: true, CompactBytes: -1}); err == nil {
			got = s.Snapshot()
			s.Close()
		}
		check("Open", got, err)
	})
}
