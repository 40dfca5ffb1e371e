package config

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/bigfleet-vm/provider/inventory"
	"github.com/bigfleet-vm/provider/plugin"
)

// Flags holds the flag values registered on a FlagSet by RegisterFlags.
// It is opaque: call Resolve after the set has been parsed.
type Flags struct {
	stateFlags
	hypervisor, installationID         *string
	useFake                            *bool
	addr, provider, defaultZone, state *string
	metricsAddr                        *string
	reflection                         *bool
	tlsCert, tlsKey, tlsCA             *string
	logFormat, logLevel                *string
	reconcileInterval                  *time.Duration
	createTimeout, configureTimeout    *time.Duration
	drainTimeout, deleteTimeout        *time.Duration
	shutdownGrace                      *time.Duration
	maxConcurrentPerZone               *int
	nodeReadyExec                      *string
	offerings, instanceTypes, prices   *string
	seedCount                          *int
	pricePerVCPU, pricePerGiB          *float64
	fakeLatency                        *time.Duration
	fakeFaults                         *bool
	// The hypervisors' own flags, one entry per registered plug-in.
	reg     *plugin.Registry
	plugins []pluginFlags
	// Listener and drift-repair flags (config/listener.go).
	metricsTLS, fakeAdmin *bool
	driftRepairDelay      *time.Duration
	repairTimeout         *time.Duration
	repairAttempts        *int
	historyEvents         *int
	historyTotal          *int
	historyRetention      *time.Duration
	// Host capacity flags.
	capacityCheck                *string
	capacityOvercommit           *float64
	fakeHostCPUs, fakeHostMemory *int
	// etcd state flags (config/etcd.go).
	etcdCA, etcdCert, etcdKey, advertiseAddr *string
	leaderLease                              *time.Duration
}

// pluginFlags are one plug-in's flags: setting any of them selects that
// hypervisor when --hypervisor is not given.
type pluginFlags struct {
	p plugin.Plugin
	f plugin.Flags
}

// RegisterFlags defines every provider flag on fs, the flags of every
// hypervisor in reg included, and returns the values to hand to Resolve.
// Subcommands may add their own flags to the same set. Flags whose
// default depends on the hypervisor (--provider, --default-zone, the four
// timeouts) are registered empty and filled in by Resolve.
func RegisterFlags(fs *flag.FlagSet, reg *plugin.Registry) *Flags {
	f := &Flags{reg: reg}
	// Core.
	var names, only, zones, creates []string
	for i, p := range reg.All() {
		in := p.Info()
		names, only = append(names, in.Name), append(only, in.Title+"-only")
		if i == 0 {
			zones = append(zones, in.DefaultZone)
		} else {
			zones = append(zones, fmt.Sprintf("or %s for %s", in.DefaultZone, in.Title))
		}
		creates = append(creates, shortDuration(in.CreateTimeout)+" for "+in.Title)
	}
	f.hypervisor = fs.String("hypervisor", "", fmt.Sprintf("%s. Empty: inferred from the flags set (%s flags), else %s.",
		plugin.JoinTitles(names, "or"), plugin.JoinTitles(only, "or"), reg.Default().Info().Name))
	f.addr = fs.String("addr", ":9000", "gRPC listen address (CapacityProvider + health + reflection).")
	f.provider = fs.String("provider", "", fmt.Sprintf("Provider label stamped on every HostRef, e.g. %s-dc1 (default %s, per hypervisor). Never part of machine ids.",
		reg.Default().Info().Name, plugin.JoinTitles(names, "or")))
	f.installationID = fs.String("installation-id", "", "Ownership namespace stamped on every VM (lowercase letters, digits, '-'). Empty: derived.")
	f.useFake = fs.Bool("use-fake-backend", false, "Run on the built-in in-memory simulator instead of real hosts (dev and conformance only).")
	f.defaultZone = fs.String("default-zone", "", fmt.Sprintf("Zone label for a single bare --connect URI, and the seed of the fake backend's two zones <zone>-a, <zone>-b (default %s).",
		strings.Join(zones, ", ")))
	f.state = fs.String("state", "", "Durable state: a file path, or etcd://HOST:PORT[,HOST:PORT...]/PREFIX for replicas that share it and elect a leader. Empty: in-memory only (state is lost on restart).")
	f.registerEtcd(fs.String, fs.Duration)
	f.registerState(fs)

	// The hypervisors, in the registry's order.
	for _, p := range reg.All() {
		f.plugins = append(f.plugins, pluginFlags{p: p, f: p.RegisterFlags(fs)})
	}

	// Instance types and pricing.
	f.instanceTypes = fs.String("instance-types", "", "JSON catalog name -> {vcpu, memory_mib[, template_vmid]} replacing the built-in kvm.* / pve.* types.")
	f.prices = fs.String("prices", "", "Explicit USD/hour per type as type=usd pairs, e.g. kvm.small=0.01,kvm.large=0.04. Empty: synthetic pricing.")
	f.pricePerVCPU = fs.Float64("price-per-vcpu-hour", inventory.DefaultPricePerVCPUHour, "Synthetic USD/hour per vCPU (>= 0).")
	f.pricePerGiB = fs.Float64("price-per-gib-hour", inventory.DefaultPricePerGiBHour, "Synthetic USD/hour per GiB of RAM (>= 0).")

	// Offerings.
	f.offerings = fs.String("offerings", "", "JSON offerings file. Empty: a built-in mix sized by --seed-count.")
	f.seedCount = fs.Int("seed-count", 32, "Number of Speculative slots in the default offerings (ignored with --offerings; must be > 0).")

	// Lifecycle.
	f.createTimeout = fs.Duration("create-timeout", 0, fmt.Sprintf("Deadline for a Create (default %s).", strings.Join(creates, ", ")))
	f.configureTimeout = fs.Duration("configure-timeout", 0, "Deadline for a Configure (default 8m).")
	f.drainTimeout = fs.Duration("drain-timeout", 0, "Deadline for a Drain (default 15m).")
	f.deleteTimeout = fs.Duration("delete-timeout", 0, "Deadline for a Delete (default 5m).")
	f.nodeReadyExec = fs.String("node-ready-exec", "", "Comma-separated in-guest argv that exits 0 once the node is Ready; Configure waits for it. Empty: no readiness gate.")
	f.maxConcurrentPerZone = fs.Int("max-concurrent-per-zone", 8, "Most hypervisor operations run at once per zone (> 0).")
	f.shutdownGrace = fs.Duration("shutdown-grace", 30*time.Second, "How long shutdown waits for in-flight work before exiting.")
	f.reconcileInterval = fs.Duration("reconcile-interval", 2*time.Minute, "Background reconcile interval (0 = off).")
	f.driftRepairDelay = fs.Duration("drift-repair-delay", 0, "How long a drift repair a full pass finds (start a stopped VM, resume a paused one) waits before it runs, so `provider plan` can show it first (0 = at once; at most 1h).")
	f.repairTimeout = fs.Duration("repair-timeout", 2*time.Minute, "Deadline of one run of a drift repair (a change without an intent); when it passes, or --repair-attempts are spent, the machine goes back to the work queue with its per-machine backoff (1s to 1h).")
	f.historyEvents = fs.Int("history-events", 50, "Events kept in each machine's history, newest first out of the ring (1 to 1000); `provider history` reads them.")
	f.historyTotal = fs.Int("history-total-events", 500000, "Events kept in the histories of all machines together; past it the oldest events go first (1000 to 10000000).")
	f.historyRetention = fs.Duration("history-retention", 24*time.Hour, "How long the history of a machine that left the document (its offering was removed) is kept (1m to 720h).")
	f.repairAttempts = fs.Int("repair-attempts", 5, "Attempts per step of one run of a drift repair before it goes back to the work queue with its per-machine backoff (1 to 100).")

	// Observability and TLS.
	f.metricsAddr = fs.String("metrics-addr", ":9090", "Address for /metrics, /healthz, /readyz and /debug/plan. Empty: disabled. If the default cannot be bound the provider logs it and serves gRPC without it; an explicitly given address that cannot be bound fails the start.")
	f.metricsTLS = fs.Bool("metrics-tls", false, "Serve the metrics listener over HTTPS with the gRPC --tls-cert/--tls-key keypair (client certificates are not requested).")
	f.reflection = fs.Bool("reflection", true, "Register gRPC server reflection (for grpcurl/debugging).")
	f.logFormat = fs.String("log-format", "text", "Log format: text or json.")
	f.logLevel = fs.String("log-level", "info", "Log level: debug, info, warn or error.")
	f.tlsCert = fs.String("tls-cert", "", "gRPC server certificate (PEM). With --tls-key, enables TLS.")
	f.tlsKey = fs.String("tls-key", "", "gRPC server private key (PEM).")
	f.tlsCA = fs.String("tls-ca", "", "gRPC client CA bundle (PEM). Enables mTLS (requires and verifies client certificates).")

	// Fake backend.
	f.fakeLatency = fs.Duration("fake-latency", 0, "Fake backend: latency added to every simulated call (0 = instant).")
	f.fakeFaults = fs.Bool("fake-faults", false, "Fake backend: honour the BigFleet conformance wire-driven fault injection.")
	f.fakeHostCPUs = fs.Int("fake-host-cpus", 0, "Fake backend: the CPUs every simulated host reports (0 = the hosts report no capacity).")
	f.fakeHostMemory = fs.Int("fake-host-memory-gib", 0, "Fake backend: the memory, in GiB, every simulated host reports (0 = the hosts report no capacity).")
	f.capacityCheck = fs.String("capacity-check", "warn", "Hold each zone's offerings against its host's capacity (read at start and on every full pass): off, warn (log and report), or refuse (refuse to start while a zone's offerings exceed its host by more than --capacity-overcommit).")
	f.capacityOvercommit = fs.Float64("capacity-overcommit", 1, "The overcommit ratio (offered over host, per resource) beyond which a zone's offerings are reported (warn) or refused (refuse).")
	f.fakeAdmin = fs.Bool("fake-admin", false, "Fake backend: serve POST /admin/* on the metrics listener, which changes the simulated world (stop, pause, resize, delete VMs, make a zone unreachable).")
	return f
}

// shortDuration writes d as help texts do: 5m, not 5m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// usageGroup is one titled group of flags in the usage.
type usageGroup struct {
	title string
	flags []string
}

// coreGroups order the core's flags for Usage, grouped as in the
// operator docs; the hypervisors' groups come after the first
// hypervisorGroupsAt of them.
const hypervisorGroupsAt = 2

var coreGroups = []usageGroup{
	{"Core", []string{"hypervisor", "addr", "provider", "installation-id", "default-zone", "state", "state-recover", "use-fake-backend"}},
	{"High availability (--state etcd://...)", []string{"etcd-ca-file", "etcd-cert-file", "etcd-key-file", "leader-lease", "advertise-addr"}},
	{"Instance types & pricing", []string{"instance-types", "prices", "price-per-vcpu-hour", "price-per-gib-hour"}},
	{"Offerings", []string{"offerings", "seed-count", "capacity-check", "capacity-overcommit"}},
	{"Lifecycle", []string{"create-timeout", "configure-timeout", "drain-timeout", "delete-timeout", "node-ready-exec", "max-concurrent-per-zone", "shutdown-grace", "reconcile-interval", "drift-repair-delay", "repair-timeout", "repair-attempts"}},
	{"History", []string{"history-events", "history-total-events", "history-retention"}},
	{"Observability & TLS", []string{"metrics-addr", "metrics-tls", "reflection", "log-format", "log-level", "tls-cert", "tls-key", "tls-ca"}},
	{"Fake backend (testing only)", []string{"fake-latency", "fake-faults", "fake-admin", "fake-host-cpus", "fake-host-memory-gib"}},
}

// usageGroups are the core's groups with each hypervisor's group (in the
// registry's order) after the high-availability flags.
func (f *Flags) usageGroups() []usageGroup {
	groups := append([]usageGroup(nil), coreGroups[:hypervisorGroupsAt]...)
	for _, pf := range f.plugins {
		groups = append(groups, usageGroup{pf.p.Info().FlagGroup, pf.f.Usage()})
	}
	return append(groups, coreGroups[hypervisorGroupsAt:]...)
}

// Usage writes the flags of fs grouped as in the operator docs; flags a
// subcommand added to fs are listed last under "Other".
func (f *Flags) Usage(w io.Writer, fs *flag.FlagSet) {
	listed := map[string]bool{}
	for _, g := range f.usageGroups() {
		fmt.Fprintf(w, "\n%s:\n", g.title)
		for _, name := range g.flags {
			if fl := fs.Lookup(name); fl != nil {
				writeFlag(w, fl)
				listed[name] = true
			}
		}
	}
	var other []*flag.Flag
	fs.VisitAll(func(fl *flag.Flag) {
		if !listed[fl.Name] {
			other = append(other, fl)
		}
	})
	if len(other) > 0 {
		fmt.Fprintf(w, "\nOther:\n")
		for _, fl := range other {
			writeFlag(w, fl)
		}
	}
}

func writeFlag(w io.Writer, fl *flag.Flag) {
	name, usage := flag.UnquoteUsage(fl)
	line := "  --" + fl.Name
	if name != "" {
		line += " " + name
	}
	fmt.Fprintln(w, line)
	fmt.Fprintf(w, "        %s", strings.ReplaceAll(usage, "\n", "\n        "))
	switch fl.DefValue {
	case "", "0", "0s", "false":
	default:
		fmt.Fprintf(w, " (default %s)", fl.DefValue)
	}
	fmt.Fprintln(w)
}
