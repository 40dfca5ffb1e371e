package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bigfleet-vm/provider/internal/providertest"
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

// TestBinaryRaceModeMatchesTheRun: the provider these tests start is built
// with -race exactly when the tests run with -race, so a data race in the
// child shows (and providertest.NoRace fails the test on its report).
func TestBinaryRaceModeMatchesTheRun(t *testing.T) {
	out, err := exec.Command("go", "version", "-m", binary).CombinedOutput()
	if err != nil {
		t.Fatalf("go version -m: %v\n%s", err, out)
	}
	built := strings.Contains(string(out), "\tbuild\t-race=true")
	if built != providertest.RaceEnabled {
		t.Errorf("the provider binary was built with -race=%v, the tests run with -race=%v:\n%s", built, providertest.RaceEnabled, out)
	}
}
