package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/internal/planschema"
	"github.com/bigfleet-vm/provider/internal/providertest"
	"github.com/bigfleet-vm/provider/jsonplan"
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

	// The plan, live (the newest full pass's reading) and offline (read
	// now), carries the capacity section: format 1.2, valid, each zone
	// with the simulated host and flagged over.
	for _, args := range [][]string{{"plan", "--server", s.MetricsURL(), "--json"}, append([]string{"plan", "--use-fake-backend", "--json"}, small...)} {
		out, code := runRaw(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s", args, code, out)
		}
		if err := planschema.Validate([]byte(out)); err != nil {
			t.Errorf("%v: invalid plan: %v", args, err)
		}
		p, err := jsonplan.Decode([]byte(out))
		if err != nil || p.FormatVersion != "1.2" || p.Capacity == nil || len(p.Capacity.Zones) == 0 {
			t.Fatalf("%v: want a 1.2 plan with a capacity section, got %v:\n%s", args, err, out)
		}
		for _, z := range p.Capacity.Zones {
			if z.Status != "ok" || z.Host == nil || z.Host.MemoryBytes != 4<<30 || z.Host.CPUs != 2 || !slices.Contains(z.Over, "memory") {
				t.Errorf("%v: zone %+v: want the 2-CPU 4 GiB host, memory over", args, z)
			}
		}
	}
	out, code := runRaw(t, "plan", "--server", s.MetricsURL(), "--no-color")
	if code != 0 || !strings.Contains(out, "Capacity (overcommit allowed up to 1):") || !strings.Contains(out, "on 4096 MiB (ratio") || !strings.Contains(out, "OVER") {
		t.Errorf("text plan lacks the capacity section (exit %d):\n%s", code, out)
	}

	out, code = runExit(t, append(small, "--capacity-check", "refuse")...)
	if code == 0 {
		t.Fatalf("an over-offered configuration started under refuse:\n%s", out)
	}
	for _, want := range []string{"--capacity-check=refuse", "cpu: the offerings place", "memory: the offerings place", "on a host of 4096 MiB"} {
		if !strings.Contains(out, want) {
			t.Errorf("refusal does not say %q:\n%s", want, out)
		}
	}
}

// TestCreateTheHostCannotHold: a Create the zone's host cannot hold, by
// its newest capacity reading and what the zone's other machines hold,
// goes FAILED with last_error naming the resource and the figures, not a
// hypervisor's message: memory must fit physically; vCPUs past the host's
// CPUs times --capacity-overcommit are held only under refuse (under
// warn, the default, they are the operator's call). Under
// --capacity-check=off
// nothing is checked.
func TestCreateTheHostCannotHold(t *testing.T) {
	eachShape(t, func(t *testing.T, sh shape) {
		zone := "local-a"
		if sh.name == "proxmox" {
			zone = "pve-a"
		}
		for _, tc := range []struct {
			name    string
			args    []string
			wantErr string // "" : the second Create succeeds
		}{
			{"memory", []string{"--fake-host-cpus", "64", "--fake-host-memory-gib", "6"},
				"create failed: host memory: zone " + zone + " has 2048 MiB free, the machine needs 4096 MiB"},
			// Under warn vCPU overcommit is the operator's call: warned
			// about by the pass, a Create is not failed for it.
			{"cpu past the overcommit ratio under warn", []string{"--fake-host-cpus", "1", "--fake-host-memory-gib", "64", "--capacity-overcommit", "2"}, ""},
			{"off", []string{"--fake-host-cpus", "64", "--fake-host-memory-gib", "6", "--capacity-check", "off"}, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				args := append(append([]string{}, sh.args...), "--offerings", offeringsFile(t, sh, "on_demand", 3, nil))
				s := start(t, append(args, tc.args...)...)
				if !slices.Contains(tc.args, "off") {
					// The check reads the newest reading of the full pass: wait for it.
					providertest.WaitMetric(t, "zone_capacity", func() float64 {
						return s.Metric("bigfleet_provider_zone_capacity", `zone="`+zone+`"`, `resource="memory"`)
					}, func(v float64) bool { return v > 0 }, time.Minute)
				}
				ids := speculative(t, s.c, 2)
				toIdle(t, s.c, ids[0]) // 2 vCPUs, 4096 MiB: fits
				providertest.Must(t, "Create "+ids[1])(create(s.c, t, ids[1], tok{}))
				if tc.wantErr == "" {
					providertest.WaitState(t, s.c, ids[1], providertest.StIdle, pollDeadline)
					return
				}
				deadline := time.Now().Add(pollDeadline) // a bound, not a timing
				m := providertest.Get(t, s.c, ids[1])
				for m.State != providertest.StFailed && time.Now().Before(deadline) {
					if m.State == providertest.StIdle {
						t.Fatalf("the Create the host cannot hold went IDLE")
					}
					sleepPoll()
					m = providertest.Get(t, s.c, ids[1])
				}
				if m.State != providertest.StFailed || m.LastError != tc.wantErr {
					t.Fatalf("machine %s: %v, last_error %q; want FAILED with %q", ids[1], m.State, m.LastError, tc.wantErr)
				}
			})
		}
	})
}
