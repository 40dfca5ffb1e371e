package metrics

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestCertificateExpiry reads the gauge at two scrape times: it counts
// down from the scrape, per role, and goes negative once expired.
func TestCertificateExpiry(t *testing.T) {
	m := New(nil, nil)
	now := time.Unix(1_700_000_000, 0)
	m.CertificateExpiry(map[string]time.Time{"server": now.Add(48 * time.Hour), "etcd-client": now.Add(time.Minute)},
		func() time.Time { return now })
	read := func() map[string]float64 {
		fams, err := m.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, f := range fams {
			if f.GetName() != "bigfleet_provider_certificate_expiry_seconds" {
				continue
			}
			for _, s := range f.GetMetric() {
				out[s.GetLabel()[0].GetValue()] = s.GetGauge().GetValue()
			}
		}
		return out
	}
	if diff := cmp.Diff(map[string]float64{"server": 172800, "etcd-client": 60}, read()); diff != "" {
		t.Errorf("at start (-want +got):\n%s", diff)
	}
	now = now.Add(2 * time.Minute)
	if diff := cmp.Diff(map[string]float64{"server": 172680, "etcd-client": -60}, read()); diff != "" {
		t.Errorf("two minutes later (-want +got):\n%s", diff)
	}
	var nilM *Metrics
	nilM.CertificateExpiry(nil, nil) // safe on nil, as every method
}
