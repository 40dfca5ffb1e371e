package cli

import (
	"runtime"
	"testing"

	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/statefile"
)

// TestSyncProcs: a provider writing a local journal runs with a P for
// each of the journal's syncing goroutines on top of the runtime's
// default; in memory, on etcd, or under an operator's GOMAXPROCS it
// leaves GOMAXPROCS alone.
func TestSyncProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	noEnv := func(string) string { return "" }
	for _, c := range []struct {
		name   string
		cfg    config.Config
		getenv func(string) string
		want   int
	}{
		{"local journal", config.Config{StatePath: "/var/lib/p/state"}, noEnv, defaultProcs + statefile.SyncingGoroutines},
		{"in memory", config.Config{}, noEnv, 0},
		{"etcd", config.Config{StatePath: "etcd://e1:2379/p", Etcd: &config.Etcd{}}, noEnv, 0},
		{"operator's GOMAXPROCS", config.Config{StatePath: "/var/lib/p/state"},
			func(k string) string { return map[string]string{"GOMAXPROCS": "3"}[k] }, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			runtime.GOMAXPROCS(defaultProcs)
			got := syncProcs(&c.cfg, c.getenv)
			if got != c.want {
				t.Fatalf("syncProcs = %d, want %d", got, c.want)
			}
			want := defaultProcs
			if c.want > 0 {
				want = c.want
			}
			if now := runtime.GOMAXPROCS(0); now != want {
				t.Fatalf("GOMAXPROCS is %d after syncProcs, want %d", now, want)
			}
		})
	}
}
