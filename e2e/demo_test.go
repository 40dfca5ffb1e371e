package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// runFlags returns the Makefile's RUN_FLAGS (what `make run` starts the
// provider with) without the listen addresses, which the harness picks,
// and with the state under dir.
func runFlags(t *testing.T, dir string) []string {
	t.Helper()
	mk, err := os.ReadFile(filepath.Join("..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^RUN_FLAGS \?= (.*)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("the Makefile has no RUN_FLAGS")
	}
	var out []string
	fields := strings.Fields(string(m[1]))
	for i := 0; i < len(fields); i++ {
		switch f := fields[i]; f {
		case "--addr", "--metrics-addr":
			i++
		case "--state":
			i++
			out = append(out, f, filepath.Join(dir, "state"))
		default:
			out = append(out, f)
		}
	}
	return out
}

// TestReadmeDriftDemo walks the README's drift demo against the binary
// started with `make run`'s flags: Create a machine, stop its VM through
// the admin endpoint, see the pending start in `provider plan --server`
// (and offline, on the state make run keeps), then see it repaired.
func TestReadmeDriftDemo(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	flags := runFlags(t, dir)
	for _, want := range []string{"--fake-admin", "--drift-repair-delay", "--state"} {
		if !strings.Contains(strings.Join(flags, " "), want) {
			t.Fatalf("RUN_FLAGS lack %s: %v", want, flags)
		}
	}
	s := start(t, flags...)
	const machine = "local-a/kvm.small/000" // the README's M
	toIdle(t, s.c, machine)

	s.Admin("stop?machine=" + machine)
	out, code := runRaw(t, "plan", "--server", s.MetricsURL(), "--no-color", "--detailed-exitcode")
	if code != 2 || !regexp.MustCompile(`(?m)^  > local-a/\S+/start  \(drift:stopped\)$`).MatchString(out) ||
		!strings.Contains(out, "1 to repair; 1 drift.") {
		t.Fatalf("after the stop, `provider plan --server` shows no pending start (exit %d):\n%s", code, out)
	}
	// make run keeps its state: the offline plan reads it while the
	// provider runs, with the flags the README gives.
	out, code = runRaw(t, "plan", "--use-fake-backend", "--seed-count", "32", "--state", filepath.Join(dir, "state"),
		"--no-color", "--detailed-exitcode")
	if code != 2 || !strings.Contains(out, "(drift:stopped)") {
		t.Fatalf("the offline plan on make run's state shows no pending start (exit %d):\n%s", code, out)
	}

	// Then the repair happens and the plan is empty again.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		out, code = runRaw(t, "plan", "--server", s.MetricsURL(), "--no-color", "--detailed-exitcode")
		if code == 0 && strings.HasSuffix(out, "\nNo changes.\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stopped VM was never repaired; the last plan (exit %d):\n%s", code, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if st := providertest.Get(t, s.c, machine).State; st != pb.MachineState_MACHINE_STATE_IDLE {
		t.Errorf("the repaired machine is %v", st)
	}
	if got := s.Metric("bigfleet_provider_drift", `zone="local-a"`, `kind="stopped"`); got != 0 {
		t.Errorf("drift{local-a,stopped} = %v after the repair", got)
	}
}
