package config

// resolveListener checks the metrics listener's and the drift repair's
// flags; the gRPC TLS flags are already in c.TLS.
func (f *Flags) resolveListener(c *Config, set map[string]bool, p *problems) {
	c.MetricsAddrExplicit = set["metrics-addr"]
	c.MetricsTLS = *f.metricsTLS
	if c.MetricsTLS {
		switch {
		case c.MetricsAddr == "":
			p.add("metrics-tls", "is set but the metrics listener is disabled (--metrics-addr is empty)")
		case !c.TLS.Enabled():
			p.add("metrics-tls", "reuses the gRPC certificate: also pass --tls-cert and --tls-key")
		}
	}
	c.DriftRepairDelay = *f.driftRepairDelay
	p.duration("drift-repair-delay", c.DriftRepairDelay)
	if *f.fakeAdmin && c.MetricsAddr == "" {
		p.add("fake-admin", "serves on the metrics listener, which is disabled (--metrics-addr is empty)")
	}
}
