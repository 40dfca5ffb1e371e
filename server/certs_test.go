package server

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/config"
)

// TestBuildPublishesCertificateExpiry: what Resolve found about the
// certificates reaches the log (close to expiry) and the expiry gauge,
// the earliest expiry per role.
func TestBuildPublishesCertificateExpiry(t *testing.T) {
	cfg, err := config.Parse(testReg, []string{"--use-fake-backend", "--seed-count", "1", "--metrics-addr", ""}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	soon := time.Now().Add(36 * time.Hour)
	cfg.Certs = []config.Cert{
		{Role: config.CertServer, File: "server.pem", Subject: "CN=a", NotAfter: soon.Add(time.Hour)},
		{Role: config.CertServer, File: "server.pem", Subject: "CN=b", NotAfter: soon},
		{Role: config.CertEtcdClient, File: "etcd.pem", Subject: "CN=c", NotAfter: soon.Add(365 * 24 * time.Hour)},
	}
	var logs bytes.Buffer
	p, err := Build(context.Background(), cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	fams, err := p.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		if f.GetName() == "bigfleet_provider_certificate_expiry_seconds" {
			for _, m := range f.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	// The gauge counts down from each scrape: bounds, not a duration.
	if v := got[config.CertServer]; v <= 0 || v > 36*3600 {
		t.Errorf("server expiry %v s, want the earliest of the role, at most 36h", v)
	}
	if v := got[config.CertEtcdClient]; v <= 36*3600 {
		t.Errorf("etcd-client expiry %v s, want about a year", v)
	}
	if len(got) != 2 {
		t.Errorf("roles %v, want server and etcd-client", got)
	}
	if n := strings.Count(logs.String(), "certificate close to expiry"); n != 2 {
		t.Errorf("%d close-to-expiry warnings, want 2 (the server pair):\n%s", n, logs.String())
	}
}
