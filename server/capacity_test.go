package server

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/capacity"
	"github.com/bigfleet-vm/provider/config"
)

// zoneGauges reads name's series by zone and resource from p's registry.
func zoneGauges(t *testing.T, p *Provider, name string) map[[2]string]float64 {
	t.Helper()
	mfs, err := p.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[[2]string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var k [2]string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "zone":
					k[0] = l.GetValue()
				case "resource":
					k[1] = l.GetValue()
				}
			}
			out[k] = m.GetGauge().GetValue()
		}
	}
	return out
}

// fullPasses counts the full passes finished (HostCheck runs before the
// count).
func fullPasses(t *testing.T, p *Provider) float64 {
	t.Helper()
	mfs, err := p.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "bigfleet_provider_reconciles_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == "full" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func buildWith(t *testing.T, log io.Writer, args ...string) (*Provider, error) {
	t.Helper()
	cfg, err := config.Parse(testReg, append([]string{"--use-fake-backend", "--seed-count", "4", "--metrics-addr", ""}, args...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return Build(context.Background(), cfg, slog.New(slog.NewTextHandler(log, nil)))
}

// TestCapacityWarn: on the simulator with a small host, the first full
// pass publishes the host, the offered and running figures and their
// ratio per zone and resource, and warns once about the over-offered
// zones; the provider runs.
func TestCapacityWarn(t *testing.T) {
	var logs syncBuffer
	p, err := buildWith(t, &logs, "--fake-host-cpus", "2", "--fake-host-memory-gib", "4")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	tm := p.current()
	tm.start()
	defer tm.drain(5*time.Second, "test over")
	deadline := time.Now().Add(20 * time.Second) // a bound, not a timing
	var ratio map[[2]string]float64
	for {
		if ratio = zoneGauges(t, p, "bigfleet_provider_zone_overcommit_ratio"); len(ratio) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(ratio) == 0 {
		t.Fatal("no zone_overcommit_ratio after the first full pass")
	}
	host := zoneGauges(t, p, "bigfleet_provider_zone_capacity")
	offered := zoneGauges(t, p, "bigfleet_provider_zone_offered")
	for _, z := range p.cfg.Zones {
		if host[[2]string{z, "cpu"}] != 2 || host[[2]string{z, "memory"}] != 4<<30 {
			t.Errorf("zone %s host %v, want 2 CPUs and 4 GiB", z, host)
		}
		for _, r := range []string{"cpu", "memory"} {
			k := [2]string{z, r}
			if want := offered[k] / host[k]; ratio[k] != want || want <= 1 {
				t.Errorf("zone %s %s: ratio %v, offered %v, host %v; want offered/host above 1", z, r, ratio[k], offered[k], host[k])
			}
		}
	}
	if n := strings.Count(logs.String(), "zone offerings exceed the host"); n != len(p.cfg.Zones) {
		t.Errorf("%d warnings, want one per zone (%d):\n%s", n, len(p.cfg.Zones), logs.String())
	}
}

// TestCapacityRefuse: under refuse the same configuration does not start,
// and says which zone and resource, with the figures; a host big enough
// starts.
func TestCapacityRefuse(t *testing.T) {
	_, err := buildWith(t, io.Discard, "--fake-host-cpus", "2", "--fake-host-memory-gib", "4", "--capacity-check", "refuse")
	if err == nil {
		t.Fatal("an over-offered configuration started under --capacity-check=refuse")
	}
	for _, want := range []string{"--capacity-check=refuse", "cpu: the offerings place", "on a host of 2 CPUs", "memory: the offerings place", "on a host of 4096 MiB"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	p, err := buildWith(t, io.Discard, "--fake-host-cpus", "10000", "--fake-host-memory-gib", "100000", "--capacity-check", "refuse")
	if err != nil {
		t.Fatalf("a host big enough: %v", err)
	}
	p.Close()
	p, err = buildWith(t, io.Discard, "--fake-host-cpus", "2", "--fake-host-memory-gib", "4", "--capacity-check", "refuse", "--capacity-overcommit", "1000")
	if err != nil {
		t.Fatalf("within a generous overcommit ratio: %v", err)
	}
	p.Close()
}

// TestCapacityOff: off reads nothing and exports no capacity series.
func TestCapacityOff(t *testing.T) {
	p, err := buildWith(t, io.Discard, "--fake-host-cpus", "2", "--fake-host-memory-gib", "4", "--capacity-check", "off")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if tm := p.current(); tm.rec == nil {
		t.Fatal("no term")
	}
	tm := p.current()
	tm.start()
	defer tm.drain(5*time.Second, "test over")
	deadline := time.Now().Add(20 * time.Second) // a bound, not a timing
	for fullPasses(t, p) < 1 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if fullPasses(t, p) < 1 {
		t.Fatal("no full pass")
	}
	if g := zoneGauges(t, p, "bigfleet_provider_zone_capacity"); len(g) != 0 {
		t.Errorf("capacity series under off: %v", g)
	}
}

// TestCapacityReadFailureWarnsOnce: a zone whose capacity cannot be read
// is warned about once per distinct failure, not on every pass, and has
// no capacity series.
func TestCapacityReadFailureWarnsOnce(t *testing.T) {
	var logs syncBuffer
	p, err := buildWith(t, &logs, "--fake-host-cpus", "2", "--fake-host-memory-gib", "4")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	tm := p.current()
	zone := p.cfg.Zones[0]
	type unreachable interface{ SetUnreachable(zone string, down bool) }
	u, ok := tm.raw.(unreachable)
	if !ok {
		t.Fatalf("the simulator %T cannot make a zone unreachable", tm.raw)
	}
	u.SetUnreachable(zone, true)
	check := hostCheck(tm.hv, &capacity.Latest{}, nil, func(string) (int, int, bool) { return 1, 1024, true }, 1, time.Second, tm.metrics, slog.New(slog.NewTextHandler(&logs, nil)))
	for range 3 {
		check(context.Background(), tm.doc.All())
	}
	if n := strings.Count(logs.String(), "read host capacity"); n != 1 {
		t.Errorf("%d read warnings over 3 passes, want 1:\n%s", n, logs.String())
	}
	p.Metrics.Serve(tm.metrics)
	if g := zoneGauges(t, p, "bigfleet_provider_zone_capacity"); g[[2]string{zone, "cpu"}] != 0 || len(g) == 0 {
		t.Errorf("capacity series %v: want none for the unreachable %s, and the others", g, zone)
	}
}
