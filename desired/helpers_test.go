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

// fileStore adapts a statefile.File to the Store contract for benchmarks.
func fileStore(f *statefile.File) Store { return fileAdapter{f} }

type fileAdapter struct{ f *statefile.File }

func (a fileAdapter) Load(ctx context.Context) (map[string][]byte, error) { return a.f.Load(ctx) }

func (a fileAdapter) Commit(ops []Op, done func(error)) {
	sops := make([]statefile.Op, len(ops))
	for i, op := range ops {
		sops[i] = statefile.Op{Key: op.Key, Value: op.Value, Delete: op.Delete}
	}
	a.f.Commit(sops, done)
}

func (a fileAdapter) Healthy() error { return a.f.Healthy() }
