package contract

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/bigfleet-vm/provider/internal/providertest"
)

func testStartupValidation(t *testing.T, h Harness) {
	badOfferings := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(badOfferings, []byte(`[
		{"instance_type": "no.such.type", "zone": "z1", "count": 1},
		{"instance_type": "x", "zone": "z1", "count": -3, "colour": "red"},
		{"zone": "z2"}
	]`), 0o644)
	tests := []struct {
		name string
		args []string
		want []string // every fragment must appear in the output
	}{
		{"several flag problems at once",
			[]string{"--seed-count", "0", "--max-concurrent-per-zone", "0", "--log-level", "loud", "--price-per-vcpu-hour", "-1"},
			[]string{"--seed-count", "--max-concurrent-per-zone", "--log-level", "--price-per-vcpu-hour"}},
		{"bad offerings, every problem", []string{"--offerings", badOfferings},
			[]string{"offerings[0]", "offerings[1]", "offerings[2]", "no.such.type", "colour", "count"}},
		{"missing offerings file", []string{"--offerings", filepath.Join(t.TempDir(), "absent.json")}, []string{"offerings"}},
		{"unknown flag", []string{"--no-such-flag"}, []string{"no-such-flag"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, code := h.runExit(t, tc.args...)
			if code == 0 {
				t.Fatalf("exit 0, want non-zero; output:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

func testOfferingsShrink(t *testing.T, h Harness) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	offerings := h.offeringsFile(t, "on_demand", 4, nil)
	s := h.start(t, "--state", state, "--offerings", offerings)
	all := providertest.IDs(providertest.ListAll(t, s.c))
	if len(all) != 4 {
		t.Fatalf("want 4 slots, got %v", all)
	}
	kept, gone := all[3], all[2] // slots 003 (created) and 002 (speculative) fall off
	toIdle(t, s.c, kept)
	host := providertest.Get(t, s.c, kept).Host

	b, _ := os.ReadFile(offerings)
	os.WriteFile(offerings, []byte(strings.Replace(string(b), `"count":4`, `"count":2`, 1)), 0o644)
	// Graceful: TestKill9RightAfterSettle covers the kill -9 window.
	if code := s.Terminate(); code != 0 {
		t.Fatalf("SIGTERM exit %d", code)
	}
	s.Launch()

	got := providertest.IDs(providertest.ListAll(t, s.c))
	want := []string{all[0], all[1], kept}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("after shrink: %v, want %v", got, want)
	}
	m := providertest.Get(t, s.c, kept)
	if m.State != providertest.StIdle || protoDiff(host, m.Host) != "" {
		t.Errorf("slotless machine: %v host %v, want IDLE on %v", m.State, m.Host, host)
	}
	checkShape(t, m, h.Provider)
	if _, err := s.c.Get(ctx(t), nil); err == nil {
		t.Errorf("Get(nil) succeeded")
	}
	if _, err := get2(s, gone); status.Code(err) != codes.NotFound {
		t.Errorf("removed SPECULATIVE slot %s: %v, want NotFound", gone, err)
	}
	providertest.Must(t, "delete slotless")(del(s.c, t, kept, tok{}))
	for end := time.Now().Add(pollDeadline); ; sleepPoll() {
		m, err := get2(s, kept)
		if status.Code(err) == codes.NotFound || (err == nil && m.State == providertest.StSpeculative) {
			t.Logf("slotless machine after Delete: %v %v", m.GetState(), err)
			break
		}
		if err != nil || m.State == providertest.StFailed || time.Now().After(end) {
			t.Fatalf("slotless machine Delete: %v %v", m, err)
		}
	}
	waitConverged(t, s)
}
