package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/config"
)

// gauge reads a gauge without labels (the serving gauge: summed over its
// provider label) from p's registry; -1 when absent.
func gauge(t *testing.T, p *Provider, name string) float64 {
	t.Helper()
	mfs, err := p.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	v := -1.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		v = 0
		for _, m := range mf.GetMetric() {
			v += m.GetGauge().GetValue()
		}
	}
	return v
}

// state_healthy and serving follow the term: a term whose lease ran out
// (its guard fails, before the replica's timers noticed) is neither
// serving nor healthy, and exports no machine series; a store that cannot
// commit is unhealthy (issue 18: replicas that could not serve for a store
// reason reported state_healthy 1).
func TestHealthAndServingFollowTheTerm(t *testing.T) {
	cfg, err := config.Parse(testReg, []string{"--use-fake-backend", "--seed-count", "2", "--metrics-addr", ""}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Build(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	read := func() [3]float64 {
		return [3]float64{gauge(t, p, "bigfleet_provider_serving"), gauge(t, p, "bigfleet_provider_state_healthy"),
			gauge(t, p, "bigfleet_provider_machines")}
	}
	if d := cmp.Diff([3]float64{1, 1, 2}, read()); d != "" {
		t.Errorf("serving a healthy term: [serving, state_healthy, machines] (-want +got):\n%s", d)
	}
	live := p.current()
	var lease error
	ended := &term{doc: live.doc, store: live.store, raw: live.raw, hv: live.hv, rec: live.rec,
		guard: func() error { return lease }}
	ended.metrics = p.Metrics.NewTerm(ended.guard)
	p.setTerm(ended)
	lease = errors.New("not the leader: no lease keepalive acknowledged in time")
	if d := cmp.Diff([3]float64{0, 0, -1}, read()); d != "" {
		t.Errorf("a term whose lease ran out: [serving, state_healthy, machines] (-want +got):\n%s", d)
	}
	lease = nil
	p.setTerm(live)
	live.doc.Refuse("test") // refusing mutations is no store failure
	if d := cmp.Diff([3]float64{1, 1, 2}, read()); d != "" {
		t.Errorf("refusing mutations (-want +got):\n%s", d)
	}
}
