package server

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/internal/etcdtest"
	"github.com/bigfleet-vm/provider/statefile"
)

// TestSyncingGoroutines: the provider reports the journal's syncing
// goroutines where it opens the journal, so the process can give them Ps;
// in memory and on etcd (whose syncs are in another process) none.
func TestSyncingGoroutines(t *testing.T) {
	ctx := context.Background()
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
			args := []string{"--use-fake-backend", "--seed-count", "1", "--addr", "127.0.0.1:0", "--metrics-addr", ""}
			if c.state != "" {
				args = append(args, "--state", c.state)
			}
			cfg, err := config.Parse(testReg, args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			p, err := Build(ctx, cfg, slog.New(slog.DiscardHandler))
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
