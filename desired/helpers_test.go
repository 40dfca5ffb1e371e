package desired

import (
	"context"
	"testing"

	"github.com/bigfleet-vm/provider/statefile"
)

func snapshot(t testing.TB, s Store) map[string][]byte {
	t.Helper()
	m, err := s.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// fileStore is a statefile.File as the document's Store (it keeps the
// contract as it is); benchmarks measure the document on it.
func fileStore(f *statefile.File) Store { return f }
