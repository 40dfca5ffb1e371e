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
func fileStore(f *statefile.File) Store { return &fileAdapter{f: f, q: make(chan func(), 1<<16)} }

type fileAdapter struct {
	f       *statefile.File
	q       chan func()
	started bool
}

func (a *fileAdapter) Load(context.Context) (map[string][]byte, error) {
	if !a.started {
		a.started = true
		go func() {
			for f := range a.q {
				f()
			}
		}()
	}
	return a.f.Snapshot(), nil
}

func (a *fileAdapter) Commit(ops []Op, done func(error)) {
	sops := make([]statefile.Op, len(ops))
	for i, op := range ops {
		sops[i] = statefile.Op{Key: op.Key, Value: op.Value, Delete: op.Delete}
	}
	seq := a.f.Apply(sops...)
	a.q <- func() {
		err := a.f.Wait(context.Background(), seq)
		if done != nil {
			done(err)
		}
	}
}

func (a *fileAdapter) Healthy() error { return a.f.Healthy() }
