package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// certExpiry reports, per certificate role, the seconds from the scrape
// to the earliest expiry among that role's certificates.
type certExpiry struct {
	desc *prometheus.Desc
	now  func() time.Time

	mu       sync.Mutex
	notAfter map[string]time.Time
}

// CertificateExpiry publishes bigfleet_provider_certificate_expiry_seconds
// {role}: for each role in notAfter (server, etcd-client,
// libvirt-client), the seconds from each scrape until that certificate
// expires, negative once it has. The provider loads its certificates at
// start, so the gauge falls until the next restart. now is the clock (nil:
// time.Now). A later call replaces the roles.
func (m *Metrics) CertificateExpiry(notAfter map[string]time.Time, now func() time.Time) {
	if m == nil {
		return
	}
	if now == nil {
		now = time.Now
	}
	roles := make(map[string]time.Time, len(notAfter))
	for r, t := range notAfter {
		roles[r] = t
	}
	m.certsOnce.Do(func() {
		m.certs = &certExpiry{now: now, desc: prometheus.NewDesc(ns+"_certificate_expiry_seconds",
			"Seconds until the certificate the provider presents in a role (server: gRPC and metrics listener; etcd-client; libvirt-client) expires; negative once expired. Loaded at start: renew the file, then restart.",
			[]string{"role"}, nil)}
		m.Registry.MustRegister(m.certs)
	})
	m.certs.mu.Lock()
	m.certs.notAfter = roles
	m.certs.mu.Unlock()
}

func (c *certExpiry) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *certExpiry) Collect(ch chan<- prometheus.Metric) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for role, t := range c.notAfter {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, t.Sub(now).Seconds(), role)
	}
}
