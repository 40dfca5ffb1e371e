package server

import (
	"io"
	"path/filepath"
	"testing"

	"github.com/bigfleet-vm/provider/internal/etcdtest"
	"github.com/bigfleet-vm/provider/statefile"
)

// TestSyncingGoroutines: the provider reports the journal's syncing
// goroutines where it opens the journal, so the process can give them Ps;
// in memory and on etcd (whose syncs are in another process) none.
func TestSyncingGoroutines(t *testing.T) {
	for _, c := range []struct {
		name  string
		state string
		want  int
	}{
		{"local journal", filepath.Join(t.TempDir(), "state"), statefile.SyncingGoroutines},
		{"in memory", "", 0},
		{"etcd", etcdtest.Start(t, etcdtest.Options{Members: 1}).URL("p"), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			var args []string
			if c.state != "" {
				args = []string{"--state", c.state}
			}
			p, err := buildWith(t, io.Discard, args...)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if got := p.SyncingGoroutines(); got != c.want {
				t.Errorf("SyncingGoroutines = %d, want %d", got, c.want)
			}
		})
	}
}
