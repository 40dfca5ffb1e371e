package cli

import (
	"runtime"

	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/statefile"
)

// defaultProcs is the runtime's GOMAXPROCS at start-up: the host's cores,
// or the container's CPU limit.
var defaultProcs = runtime.GOMAXPROCS(0)

// syncProcs sets GOMAXPROCS for a provider that writes a local journal
// (statefile.SyncingGoroutines: the journal's syncing goroutines get Ps of their own)
// and returns it; 0 when it leaves GOMAXPROCS alone: in memory, on etcd
// (whose syncs are in another process), or when the operator set
// GOMAXPROCS. Once set, the runtime no longer follows a container's CPU
// limit changing under the running process: the limit is read once, at
// start-up.
func syncProcs(cfg *config.Config, getenv func(string) string) int {
	if cfg.StatePath == "" || cfg.Etcd != nil || getenv("GOMAXPROCS") != "" {
		return 0
	}
	n := defaultProcs + statefile.SyncingGoroutines
	runtime.GOMAXPROCS(n)
	return n
}
