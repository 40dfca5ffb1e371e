package statefile

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// asStrings compares state values as strings: readable diffs, and fast
// for large values.
var asStrings = cmp.Transformer("string", func(b []byte) string { return string(b) })

func put(k, v string) Op { return Op{Key: k, Value: []byte(v)} }
func del(k string) Op    { return Op{Key: k, Delete: true} }

// statePath returns a state path in a fresh directory.
func statePath(t testing.TB) string {
	return filepath.Join(t.TempDir(), "state")
}

func mustOpen(t testing.TB, path string, opts Options) *File {
	t.Helper()
	f, err := Open(path, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return f
}

func mustApply(t testing.TB, s Store, ops ...Op) uint64 {
	t.Helper()
	seq := s.Apply(ops...)
	if err := s.Wait(context.Background(), seq); err != nil {
		t.Fatalf("Wait(%d): %v", seq, err)
	}
	return seq
}

func mustClose(t testing.TB, s Store) {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// reopen returns the state a fresh Open recovers from path.
func reopen(t testing.TB, path string) map[string][]byte {
	t.Helper()
	f := mustOpen(t, path, Options{})
	defer mustClose(t, f)
	return f.Snapshot()
}

// frameOffsets lists where each frame of the journal at path starts, and
// the file's length.
func frameOffsets(t testing.TB, path string) ([]int64, int64) {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		t.Fatal(err)
	}
	fr := newFrameReader(path, fh, st.Size())
	var offs []int64
	for {
		at := fr.off
		_, fault, err := fr.next()
		if errors.Is(err, io.EOF) {
			return offs, st.Size()
		}
		if err != nil || fault != nil {
			t.Fatalf("frameOffsets %s: %v %+v", path, err, fault)
		}
		offs = append(offs, at)
	}
}

// copyState copies the state files at from (whichever exist) to a fresh
// path and returns it, like the disk a crash at this instant would leave.
func copyState(t testing.TB, from string) string {
	t.Helper()
	to := statePath(t)
	p, q := pathsFor(from), pathsFor(to)
	for i, src := range []string{p.snap, p.journal, p.next, p.mark, p.snap + ".tmp", p.next + ".tmp", p.journal + ".tmp", p.mark + ".tmp"} {
		dst := []string{q.snap, q.journal, q.next, q.mark, q.snap + ".tmp", q.next + ".tmp", q.journal + ".tmp", q.mark + ".tmp"}[i]
		b, err := os.ReadFile(src)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return to
}

func existing(t testing.TB, path string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// metaFrameSize is the size of a snapshot's meta frame when the journal
// length it records is under 128 bytes (a one-byte varint).
const metaFrameSize = frameHeaderSize + 2
