package cli

import (
	"runtime"
	"testing"
)

// TestSyncProcs: a provider with syncing goroutines runs with a P for
// each on top of the runtime's default; with none, or under an
// operator's GOMAXPROCS, it leaves GOMAXPROCS alone.
func TestSyncProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	noEnv := func(string) string { return "" }
	for _, c := range []struct {
		name    string
		syncing int
		getenv  func(string) string
		want    int
	}{
		{"local journal", 2, noEnv, defaultProcs + 2},
		{"nothing syncs", 0, noEnv, 0},
		{"operator's GOMAXPROCS", 2, func(k string) string { return map[string]string{"GOMAXPROCS": "3"}[k] }, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			runtime.GOMAXPROCS(defaultProcs)
			got := syncProcs(c.syncing, c.getenv)
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
