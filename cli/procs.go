package cli

import "runtime"

// defaultProcs is the runtime's GOMAXPROCS at start-up: the host's cores,
// or the container's CPU limit.
var defaultProcs = runtime.GOMAXPROCS(0)

// syncProcs gives each of the provider's syncing goroutines (those that
// spend their time blocked in fsync: server.Provider.SyncingGoroutines) a
// P of its own on top of the runtime's default, and returns the new
// GOMAXPROCS; 0 when it leaves GOMAXPROCS alone: nothing syncs in this
// process, or the operator set GOMAXPROCS. Once set, the runtime no
// longer follows a container's CPU limit changing under the running
// process: the limit is read once, at start-up.
func syncProcs(syncing int, getenv func(string) string) int {
	if syncing == 0 || getenv("GOMAXPROCS") != "" {
		return 0
	}
	n := defaultProcs + syncing
	runtime.GOMAXPROCS(n)
	return n
}
