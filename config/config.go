package config

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/bigfleet-vm/provider/inventory"
	"github.com/bigfleet-vm/provider/plugin"
)

// BackendFake names the built-in simulator as the backend; a real
// backend is named by its hypervisor (Config.Hypervisor).
const BackendFake = "fake"

// Secret holds a credential that never prints (plugin.Secret).
type Secret = plugin.Secret

// Config is the validated configuration of one provider process.
type Config struct {
	// Hypervisor is the registered name of the hypervisor served.
	Hypervisor string
	// Plugin is that hypervisor, resolved from its flags: its settings,
	// planner, adapter and simulator.
	Plugin plugin.Resolved
	// Backend is BackendFake, or Hypervisor for the real backend.
	Backend  string
	Provider string
	// InstallationID is the --installation-id given, or "" when the caller
	// must derive one.
	InstallationID string
	Addr           string
	MetricsAddr    string // "" disables the metrics listener
	// MetricsAddrExplicit is true when --metrics-addr was given: failing to
	// bind it fails the start. The default address is best effort.
	MetricsAddrExplicit bool
	// MetricsTLS serves the metrics listener over HTTPS with TLS.Cert/Key.
	MetricsTLS bool
	// DriftRepairDelay holds back a repair a full pass found.
	DriftRepairDelay time.Duration
	// RepairTimeout and RepairAttempts bound one run of a drift repair
	// (--repair-timeout, --repair-attempts per step); a repair that runs
	// out goes back to the work queue's per-machine backoff.
	RepairTimeout  time.Duration
	RepairAttempts int
	// HistoryEvents, HistoryTotal and HistoryRetention bound the
	// per-machine history (--history-events per machine,
	// --history-total-events for all, --history-retention for machines
	// that left the document).
	HistoryEvents    int
	HistoryTotal     int
	HistoryRetention time.Duration
	Reflection       bool
	TLS              TLS
	LogFormat        string // "text" or "json"
	LogLevel         slog.Level
	StatePath        string // "" keeps state in memory only
	// StateRecover is --state-recover=truncate: open a file state past
	// damage to acknowledged records, dropping them (statefile Recover).
	StateRecover bool
	// Etcd is set when StatePath is an etcd:// URL (replicas, one leader).
	Etcd              *Etcd
	ReconcileInterval time.Duration
	// CapacityCheck is off, warn or refuse (--capacity-check), and
	// CapacityOvercommit the ratio it allows (--capacity-overcommit).
	CapacityCheck      string
	CapacityOvercommit float64
	Timeouts           Timeouts
	// Zones are the zones this process serves, in order: the real
	// backend's (Plugin.Zones: --connect zones, --nodes); on the fake
	// backend the two synthetic zones followed by any other offering
	// zones, sorted.
	Zones     []string
	Catalog   inventory.Catalog
	Offerings []inventory.Offering
	// Slots are all slots the offerings mint, sorted by ID.
	Slots   []inventory.Slot
	Pricing inventory.Pricing
	// BareMetal is true when every offering is bare_metal (a fixed free
	// pool: Delete is not offered).
	BareMetal            bool
	Fake                 Fake
	NodeReadyExec        []string // nil: no readiness gate
	MaxConcurrentPerZone int
	ShutdownGrace        time.Duration
	// Certs are the certificate chains the provider presents (server,
	// etcd and the hypervisor's client certificates), checked valid at start; start-up logs
	// CertWarnings and the expiry gauge reports them.
	Certs []Cert
	// CAWarnings are what CertWarnings says about the CA bundles the
	// provider trusts (--tls-ca, --etcd-ca-file, the hypervisor's).
	CAWarnings []string
}

// TLS names the gRPC listener's PEM files; all empty means plaintext, Cert
// and Key mean TLS, plus CA means mTLS. Resolve has checked that the
// keypair loads and the CA holds a certificate.
type TLS struct {
	Cert, Key, CA string
}

// Enabled reports whether the listener serves TLS.
func (t TLS) Enabled() bool { return t.Cert != "" }

// Mutual reports whether client certificates are required and verified.
func (t TLS) Mutual() bool { return t.CA != "" }

// Timeouts are the per-transition deadlines.
type Timeouts struct {
	Create, Configure, Drain, Delete time.Duration
}

// Fake configures the in-memory simulator.
type Fake struct {
	Latency time.Duration
	// Faults enables the BigFleet conformance wire-driven fault mode.
	Faults bool
	// Admin serves the /admin/ endpoints that change the simulated world.
	Admin bool
	// HostCPUs and HostMemoryGiB are every simulated host's capacity
	// (0: no reading).
	HostCPUs, HostMemoryGiB int
}

// Capacity checks: what --capacity-check does with a zone whose
// offerings exceed its host by more than --capacity-overcommit.
const (
	CapacityOff    = "off"
	CapacityWarn   = "warn"
	CapacityRefuse = "refuse"
)

// String summarises the configuration for people, the hypervisor's
// settings last. It never contains a secret or the base user data.
func (c *Config) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "hypervisor=%s backend=%s provider=%s installation=%q zones=%s offerings=%d slots=%d bare_metal=%t addr=%s metrics_addr=%q tls=%t mtls=%t state=%q",
		c.Hypervisor, c.Backend, c.Provider, c.InstallationID, strings.Join(c.Zones, ","), len(c.Offerings), len(c.Slots), c.BareMetal,
		c.Addr, c.MetricsAddr, c.TLS.Enabled(), c.TLS.Mutual(), c.StatePath)
	if c.Plugin != nil {
		text, _ := c.Plugin.Summary()
		b.WriteString(text)
	}
	return b.String()
}

// LogValue implements slog.LogValuer with the same fields as String.
func (c *Config) LogValue() slog.Value {
	attrs := []slog.Attr{
		slog.String("hypervisor", c.Hypervisor),
		slog.String("backend", c.Backend),
		slog.String("provider", c.Provider),
		slog.String("installation", c.InstallationID),
		slog.Any("zones", c.Zones),
		slog.Int("offerings", len(c.Offerings)),
		slog.Int("slots", len(c.Slots)),
		slog.Bool("bare_metal", c.BareMetal),
		slog.String("addr", c.Addr),
		slog.String("metrics_addr", c.MetricsAddr),
		slog.Bool("tls", c.TLS.Enabled()),
		slog.Bool("mtls", c.TLS.Mutual()),
		slog.String("state", c.StatePath),
	}
	if c.Plugin != nil {
		_, more := c.Plugin.Summary()
		attrs = append(attrs, more...)
	}
	return slog.GroupValue(attrs...)
}
