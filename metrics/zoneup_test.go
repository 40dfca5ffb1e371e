package metrics

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// series reads the metric called name as key(its labels) -> value, for a
// counter or a gauge.
func series(t *testing.T, m *Metrics, name string, key func(labels map[string]string) string) map[string]float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range mt.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			out[key(l)] = mt.GetGauge().GetValue() + mt.GetCounter().GetValue()
		}
	}
	return out
}

// zoneUp reads zone_up as zone -> value.
func zoneUp(t *testing.T, m *Metrics) map[string]float64 {
	t.Helper()
	return series(t, m, "bigfleet_provider_zone_up", func(l map[string]string) string { return l["zone"] })
}

// With a live health source zone_up is computed at scrape time from it
// (issue 12: it only changed at full passes, so it read 0 for minutes
// after a start and never showed a short outage), whatever the last
// observation said.
func TestZoneUpFollowsLiveHealth(t *testing.T) {
	m := New(nil, nil)
	tm := m.NewTerm(nil)
	m.Serve(tm)
	tm.ZoneObserved("a", false, time.Now()) // the first pass ran before the dial finished
	tm.ZoneObserved("b", true, time.Now())
	if d := cmp.Diff(map[string]float64{"a": 0, "b": 1}, zoneUp(t, m)); d != "" {
		t.Errorf("without a health source (-want +got):\n%s", d)
	}
	var mu sync.Mutex
	health := map[string]error{"a": nil, "b": nil}
	m.SetZoneHealth(func() map[string]error {
		mu.Lock()
		defer mu.Unlock()
		out := map[string]error{}
		for k, v := range health {
			out[k] = v
		}
		return out
	})
	if d := cmp.Diff(map[string]float64{"a": 1, "b": 1}, zoneUp(t, m)); d != "" {
		t.Errorf("live, both up (-want +got):\n%s", d)
	}
	mu.Lock()
	health["b"] = errors.New("down")
	mu.Unlock()
	if d := cmp.Diff(map[string]float64{"a": 1, "b": 0}, zoneUp(t, m)); d != "" {
		t.Errorf("live, b down (-want +got):\n%s", d)
	}
}
