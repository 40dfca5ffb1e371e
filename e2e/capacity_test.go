package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/internal/providertest"
)

// TestCapacityAgainstTheHosts runs the binary on the simulator with hosts
// far smaller than the default offerings: under warn it serves, exports
// the host, the offered figures and their ratio per zone, and says so in
// its log; under refuse the same configuration exits before listening,
// naming the resources with their figures.
func TestCapacityAgainstTheHosts(t *testing.T) {
	small := []string{"--seed-count", "4", "--fake-host-cpus", "2", "--fake-host-memory-gib", "4"}
	s := start(t, small...)
	ratio := providertest.WaitMetric(t, "zone_overcommit_ratio{resource=memory}", func() float64 {
		return s.Metric("bigfleet_provider_zone_overcommit_ratio", `resource="memory"`)
	}, func(v float64) bool { return v > 1 }, time.Minute)
	host := s.Metric("bigfleet_provider_zone_capacity", `resource="memory"`)
	offered := s.Metric("bigfleet_provider_zone_offered", `resource="memory"`)
	if host <= 0 || int64(host)%(4<<30) != 0 || offered <= host {
		t.Errorf("host memory %v (want a multiple of 4 GiB), offered %v (want above it), ratio %v", host, offered, ratio)
	}
	if !strings.Contains(s.Output(), "zone offerings exceed the host beyond the overcommit ratio") {
		t.Errorf("no capacity warning in the log:\n%s", s.Output())
	}

	out, code := runExit(t, append(small, "--capacity-check", "refuse")...)
	if code == 0 {
		t.Fatalf("an over-offered configuration started under refuse:\n%s", out)
	}
	for _, want := range []string{"--capacity-check=refuse", "cpu: the offerings place", "memory: the offerings place", "on a host of 4096 MiB"} {
		if !strings.Contains(out, want) {
			t.Errorf("refusal does not say %q:\n%s", want, out)
		}
	}
}
