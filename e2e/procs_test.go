package e2e

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/bigfleet-vm/provider/internal/providertest"
	"github.com/bigfleet-vm/provider/statefile"
)

// startProcs is this process's GOMAXPROCS before the testing package
// applies -cpu: the runtime's default, which the provider starts from too.
var startProcs = runtime.GOMAXPROCS(0)

// TestJournalProcs: the binary writing a local journal runs with a P
// for each of the journal's syncing goroutines beyond the runtime's
// default (a commit's fsync and the mark's fdatasync would otherwise
// hold both Ps of a two-core host); in memory it keeps the default.
func TestJournalProcs(t *testing.T) {
	if os.Getenv("GOMAXPROCS") != "" {
		t.Skip("GOMAXPROCS is set: the provider keeps the operator's")
	}
	t.Parallel()
	const gauge = "go_sched_gomaxprocs_threads"
	for _, c := range []struct {
		name string
		args []string
		want int
	}{
		{"journal", []string{"--state", filepath.Join(t.TempDir(), "state")}, startProcs + statefile.SyncingGoroutines},
		{"memory", nil, startProcs},
	} {
		s := start(t, c.args...)
		if got := providertest.Metric(s.metrics(), gauge); got != float64(c.want) {
			t.Errorf("%s: %s = %v, want %d", c.name, gauge, got, c.want)
		}
	}
}
