package e2e

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestNewcomerCLI runs the binary the way a newcomer first does: help on
// every subcommand exits 0, a typo in the subcommand lists them all, and
// a --state path with nothing there is an error, not a clean plan.
func TestNewcomerCLI(t *testing.T) {
	for _, args := range [][]string{{"serve", "-h"}, {"plan", "-h"}, {"pve-sim", "-h"}, {"help"}, {"-h"}} {
		out, code := runRaw(t, args...)
		if code != 0 || strings.Contains(out, "help requested") {
			t.Errorf("provider %v: exit %d\n%s", args, code, out)
		}
	}
	out, code := runRaw(t, "sevre")
	if code != 2 || !strings.Contains(out, "pve-sim") || !strings.Contains(out, "plan") {
		t.Errorf("provider sevre: exit %d\n%s", code, out)
	}
	out, code = runRaw(t, "plan", "--use-fake-backend", "--state", filepath.Join(t.TempDir(), "no-such-state"))
	if code != 1 || !strings.Contains(out, "no state file there") {
		t.Errorf("plan on a missing --state: exit %d\n%s", code, out)
	}
}
