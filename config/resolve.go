package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/bigfleet-vm/provider/etcdstore"
	"github.com/bigfleet-vm/provider/inventory"
	"github.com/bigfleet-vm/provider/planner"
	"github.com/bigfleet-vm/provider/plugin"
	"github.com/bigfleet-vm/provider/statefile"
	"github.com/hashicorp/go-multierror"
)

// Parse parses args as the provider's flags, the flags of every
// hypervisor in reg included, and resolves them. Flag-syntax errors and -h
// are reported by the flag package on stderr (with Usage); -h yields an
// error wrapping flag.ErrHelp. Positional arguments are an error.
func Parse(reg *plugin.Registry, args []string, stderr io.Writer) (*Config, error) {
	fs := flag.NewFlagSet("provider", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f *Flags
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: provider [flags]\n")
		f.Usage(stderr, fs)
	}
	f = RegisterFlags(fs, reg)
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("parse flags: %w", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q: the provider takes flags only (did you forget a -- on a flag?)", fs.Arg(0))
	}
	return f.Resolve(fs)
}

// problems collects configuration errors, one per line, each led by the
// flag it concerns.
type problems struct {
	errs *multierror.Error
	// bounds are the hypervisors' bounded flags (the core's are in the
	// package tables).
	bounds plugin.Bounds
}

// pluginProblems is problems as a plug-in's resolution sees them.
type pluginProblems struct {
	p   *problems
	c   *Config
	now time.Time
}

func (pp pluginProblems) Add(flagName, format string, args ...any) {
	pp.p.add(flagName, format, args...)
}
func (pp pluginProblems) AddErr(flagName string, err error) { pp.p.addErr(flagName, err) }
func (pp pluginProblems) Duration(flagName string, d time.Duration) bool {
	return pp.p.duration(flagName, d)
}
func (pp pluginProblems) Integer(flagName string, n int) bool { return pp.p.integer(flagName, n) }

// CABundle checks a CA bundle the hypervisor trusts like the core's own.
func (pp pluginProblems) CABundle(flagName, file string) {
	warnings, err := checkCABundle(file, pp.now)
	if err != nil {
		pp.p.add(flagName, "%v", err)
	}
	pp.c.CAWarnings = append(pp.c.CAWarnings, warnings...)
}

func (p *problems) add(flagName, format string, args ...any) {
	p.errs = multierror.Append(p.errs, fmt.Errorf("--%s: %s", flagName, fmt.Sprintf(format, args...)))
}

// addErr adds err under flagName, one entry per problem if err is a list.
func (p *problems) addErr(flagName string, err error) {
	var me *multierror.Error
	if errors.As(err, &me) {
		for _, e := range me.Errors {
			p.addErr(flagName, e)
		}
		return
	}
	p.add(flagName, "%s", err.Error())
}

func (p *problems) err() error {
	if p.errs == nil {
		return nil
	}
	p.errs.ErrorFormat = func(errs []error) string {
		lines := make([]string, 0, len(errs)+1)
		noun := "problems"
		if len(errs) == 1 {
			noun = "problem"
		}
		lines = append(lines, fmt.Sprintf("invalid configuration (%d %s):", len(errs), noun))
		for _, e := range errs {
			lines = append(lines, "  "+e.Error())
		}
		return strings.Join(lines, "\n")
	}
	return p.errs
}

// Resolve validates the parsed flags of fs and returns the configuration,
// or an error listing every problem (a *multierror.Error whose entries are
// one problem each, led by the flag's name).
func (f *Flags) Resolve(fs *flag.FlagSet) (*Config, error) {
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	p := problems{bounds: f.reg.Bounds()}
	c := &Config{}

	hv := f.resolveHypervisor(set, &p)
	info := hv.p.Info()
	c.Hypervisor = info.Name

	// Per-hypervisor defaults.
	c.Provider = strings.TrimSpace(*f.provider)
	if !set["provider"] {
		c.Provider = info.Name
	} else if c.Provider == "" || strings.ContainsFunc(c.Provider, unicode.IsSpace) {
		p.add("provider", "%q must be a non-empty label without whitespace, e.g. %s-dc1", *f.provider, c.Hypervisor)
	}
	defaultZone := *f.defaultZone
	if !set["default-zone"] {
		defaultZone = info.DefaultZone
	}
	zoneOK := defaultZone != "" && inventory.ValidateZone(defaultZone+"-a") == nil
	if !zoneOK && !hv.f.ReportsDefaultZone(set) {
		p.add("default-zone", "%q is not a usable zone name: it must be non-empty, at most 61 bytes, without '/', ':' or whitespace", defaultZone)
	}
	c.Timeouts = f.resolveTimeouts(set, info.CreateTimeout, &p)

	f.resolveCommon(c, set, &p)
	c.Backend = f.resolveBackend(hv, set, &p)
	real := c.Backend != BackendFake
	if !real {
		c.Fake = Fake{Latency: *f.fakeLatency, Faults: *f.fakeFaults, Admin: *f.fakeAdmin,
			HostCPUs: *f.fakeHostCPUs, HostMemoryGiB: *f.fakeHostMemory}
	} else {
		for _, name := range []string{"fake-latency", "fake-faults", "fake-admin", "fake-host-cpus", "fake-host-memory-gib"} {
			if set[name] {
				p.add(name, "only applies to the fake backend, but the %s backend is selected; drop it or pass --use-fake-backend", c.Backend)
			}
		}
	}

	// The hypervisor's own settings; realZones is nil unless a real
	// backend's zones parsed cleanly.
	now := time.Now()
	c.Plugin = hv.f.Resolve(plugin.Env{Set: set, Real: real, DefaultZone: defaultZone, Now: now}, pluginProblems{p: &p, c: c, now: now})
	if pl := c.Plugin.Planner(plugin.PlannerOptions{Simulated: !real}); pl != nil {
		if err := planner.CheckPlugin(pl); err != nil {
			p.add("hypervisor", "%v", err) // a defect of the build's plug-in, reported before anything runs
		}
	}
	realZones, zonesFlag := c.Plugin.Zones()
	capacity := c.Plugin.Capacity()
	resolveTLS(c, *f.tlsCert, *f.tlsKey, *f.tlsCA, now, &p)
	if real {
		checkClientCerts(c, c.Plugin.Certs(), now, &p)
	}
	f.resolveListener(c, set, &p)

	// Catalog, pricing, offerings, slots.
	catalogOK := true
	if *f.instanceTypes != "" {
		cat, err := inventory.LoadCatalog(*f.instanceTypes, c.Plugin.Catalog())
		if err != nil {
			catalogOK = false
			p.addErr("instance-types", err)
		}
		c.Catalog = cat
	} else {
		c.Catalog = inventory.Builtin(c.Plugin.Catalog())
	}
	explicit, err := inventory.ParsePrices(*f.prices, c.Catalog)
	if err != nil && catalogOK {
		p.addErr("prices", err)
	}
	p.number("price-per-vcpu-hour", *f.pricePerVCPU)
	p.number("price-per-gib-hour", *f.pricePerGiB)
	c.Pricing, _ = inventory.NewPricing(*f.pricePerVCPU, *f.pricePerGiB, explicit)

	seedOK := !set["seed-count"] || p.integer("seed-count", *f.seedCount)
	if (real && realZones == nil) || (!real && !zoneOK) {
		// The zones failed to resolve (already reported); offerings
		// cannot be placed.
		if p.errs == nil {
			p.add(zonesFlag, "resolves to no zones")
		}
		return nil, p.err()
	}
	switch {
	case !catalogOK:
		// Offerings name catalog types; checking them now would only
		// repeat the catalog's problems.
	case *f.offerings != "":
		rules := inventory.Rules{Capacity: c.Plugin.CapacityRules(), Catalog: c.Catalog, Zones: realZones, ZoneFlag: "--" + zonesFlag}
		offs, err := inventory.LoadOfferings(*f.offerings, rules)
		if err != nil {
			p.addErr("offerings", err)
		}
		c.Offerings = offs
	case seedOK:
		zones := realZones
		if !real {
			zones = []string{defaultZone + "-a", defaultZone + "-b"}
		}
		offs, err := inventory.DefaultOfferings(c.Plugin.Catalog().Prefix, c.Plugin.CapacityRules(), c.Catalog, zones, *f.seedCount, capacity)
		if err != nil {
			p.addErr("seed-count", err)
		}
		if !real && c.Fake.Faults {
			// The conformance fault convention needs slots whose Create fails.
			offs = append(offs, inventory.FaultOfferings(c.Catalog, offs, capacity)...)
		}
		c.Offerings = offs
	}
	if err := p.err(); err != nil {
		return nil, err
	}

	if real {
		c.Zones = realZones
	} else {
		c.Zones = []string{defaultZone + "-a", defaultZone + "-b"}
		for _, z := range inventory.Zones(c.Offerings) {
			if !slices.Contains(c.Zones, z) {
				c.Zones = append(c.Zones, z)
			}
		}
	}
	c.BareMetal = len(c.Offerings) > 0
	for _, o := range c.Offerings {
		if o.CapacityType != inventory.BareMetal {
			c.BareMetal = false
		}
	}
	slots, err := inventory.Slots(c.Offerings, c.Catalog, c.Pricing)
	if err != nil {
		p.addErr("offerings", err)
		return nil, p.err()
	}
	c.Slots = slots
	return c, nil
}

// resolveHypervisor applies --hypervisor, or infers the hypervisor from
// which hypervisor's flags were set; none set is the registry's default.
func (f *Flags) resolveHypervisor(set map[string]bool, p *problems) pluginFlags {
	given := make([][]string, len(f.plugins)) // the flags set, per plug-in
	var chosen []int
	for i, pf := range f.plugins {
		for _, n := range pf.f.Names() {
			if set[n] {
				given[i] = append(given[i], "--"+n)
			}
		}
		if len(given[i]) > 0 {
			chosen = append(chosen, i)
		}
	}
	if name := strings.ToLower(strings.TrimSpace(*f.hypervisor)); name != "" {
		if want, ok := f.reg.Lookup(name); ok {
			var picked pluginFlags
			for _, pf := range f.plugins {
				if pf.p == want {
					picked = pf
				}
			}
			in := picked.p.Info()
			for j, other := range f.plugins {
				if other.p != want && len(given[j]) > 0 {
					o := other.p.Info()
					p.add("hypervisor", "is %s, but %s-only flags are set (%s); drop them or use --hypervisor=%s", in.Name, o.Title, strings.Join(given[j], ", "), o.Name)
				}
			}
			return picked
		}
		p.add("hypervisor", "unknown hypervisor %q; use %s (or omit it to infer from the flags)", *f.hypervisor, plugin.JoinTitles(f.reg.Names(), "or"))
	}
	switch {
	case len(chosen) > 1:
		var sides []string
		for _, i := range chosen {
			sides = append(sides, fmt.Sprintf("%s-only flags (%s)", f.plugins[i].p.Info().Title, strings.Join(given[i], ", ")))
		}
		both := "both"
		if len(sides) > 2 {
			both = "all"
		}
		p.add("hypervisor", "cannot infer the hypervisor: %s are %s set; run one process per hypervisor and drop one side's flags, or pass --hypervisor",
			plugin.JoinTitles(sides, "and"), both)
	case len(chosen) == 1:
		return f.plugins[chosen[0]]
	}
	return f.plugins[0]
}

func (f *Flags) resolveTimeouts(set map[string]bool, create time.Duration, p *problems) Timeouts {
	t := Timeouts{Create: create, Configure: 8 * time.Minute, Drain: 15 * time.Minute, Delete: 5 * time.Minute}
	for _, d := range []struct {
		name string
		v    *time.Duration
		dst  *time.Duration
	}{
		{"create-timeout", f.createTimeout, &t.Create},
		{"configure-timeout", f.configureTimeout, &t.Configure},
		{"drain-timeout", f.drainTimeout, &t.Drain},
		{"delete-timeout", f.deleteTimeout, &t.Delete},
	} {
		if !set[d.name] {
			continue
		}
		if !p.duration(d.name, *d.v) {
			continue
		}
		*d.dst = *d.v
	}
	return t
}

var installationRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$`)

func (f *Flags) resolveCommon(c *Config, set map[string]bool, p *problems) {
	c.InstallationID = *f.installationID
	if set["installation-id"] && !installationRE.MatchString(c.InstallationID) {
		p.add("installation-id", "%q must be 1-32 lowercase letters, digits or '-', starting and ending with a letter or digit (or omit it to derive one)", c.InstallationID)
	}
	c.Addr = *f.addr
	if err := checkListenAddr(c.Addr); err != nil {
		p.add("addr", "%v", err)
	}
	c.MetricsAddr = *f.metricsAddr
	if c.MetricsAddr != "" {
		if err := checkListenAddr(c.MetricsAddr); err != nil {
			p.add("metrics-addr", "%v (or pass an empty value to disable metrics)", err)
		} else if c.MetricsAddr == c.Addr && !strings.HasSuffix(c.Addr, ":0") {
			p.add("metrics-addr", "%q is also the gRPC --addr; give each listener its own port", c.MetricsAddr)
		}
	}
	c.Reflection = *f.reflection
	c.StatePath = *f.state
	if err := checkStatePath(c.StatePath); err != nil {
		p.add("state", "%v", err)
	}
	f.resolveEtcd(c, set, p)
	f.resolveState(c, set, p)
	switch strings.ToLower(*f.logFormat) {
	case "text", "json":
		c.LogFormat = strings.ToLower(*f.logFormat)
	default:
		p.add("log-format", "unknown format %q; use text or json", *f.logFormat)
	}
	switch strings.ToLower(*f.logLevel) {
	case "debug":
		c.LogLevel = slog.LevelDebug
	case "info":
		c.LogLevel = slog.LevelInfo
	case "warn":
		c.LogLevel = slog.LevelWarn
	case "error":
		c.LogLevel = slog.LevelError
	default:
		p.add("log-level", "unknown level %q; use debug, info, warn or error", *f.logLevel)
	}
	c.ReconcileInterval = *f.reconcileInterval
	p.duration("reconcile-interval", c.ReconcileInterval)
	c.MaxConcurrentPerZone = *f.maxConcurrentPerZone
	p.integer("max-concurrent-per-zone", c.MaxConcurrentPerZone)
	c.ShutdownGrace = *f.shutdownGrace
	p.duration("shutdown-grace", c.ShutdownGrace)
	p.duration("fake-latency", *f.fakeLatency)
	c.RepairTimeout = *f.repairTimeout
	p.duration("repair-timeout", c.RepairTimeout)
	c.RepairAttempts = *f.repairAttempts
	p.integer("repair-attempts", c.RepairAttempts)
	switch c.CapacityCheck = strings.ToLower(*f.capacityCheck); c.CapacityCheck {
	case CapacityOff, CapacityWarn, CapacityRefuse:
	default:
		p.add("capacity-check", "unknown mode %q; use off, warn or refuse", *f.capacityCheck)
	}
	c.CapacityOvercommit = *f.capacityOvercommit
	if !(c.CapacityOvercommit > 0) {
		p.add("capacity-overcommit", "must be above 0, got %v", c.CapacityOvercommit)
	}
	if *f.fakeHostCPUs < 0 || *f.fakeHostMemory < 0 {
		p.add("fake-host-cpus", "the simulated host's CPUs (%d) and memory GiB (%d) must not be negative", *f.fakeHostCPUs, *f.fakeHostMemory)
	}
	c.HistoryEvents = *f.historyEvents
	p.integer("history-events", c.HistoryEvents)
	c.HistoryTotal = *f.historyTotal
	p.integer("history-total-events", c.HistoryTotal)
	c.HistoryRetention = *f.historyRetention
	p.duration("history-retention", c.HistoryRetention)
	if *f.nodeReadyExec != "" {
		argv, err := plugin.ParseArgv(*f.nodeReadyExec)
		if err != nil {
			p.add("node-ready-exec", "%v", err)
		}
		c.NodeReadyExec = argv
	}
}

// checkListenAddr reports why addr is not a host:port to listen on.
func checkListenAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port (e.g. :9000 or 127.0.0.1:9000)", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%q has port %q; use a number from 0 to 65535", addr, port)
	}
	return nil
}

// stateURLRE matches a --state value that starts like a URL: an RFC 3986
// scheme and "://".
var stateURLRE = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]*)://`)

// checkStatePath says why --state cannot name a state this build can
// open: a store other than a local file (chosen by URL scheme; this is the
// one place that knows which schemes are built in), or a path that names
// a directory. Empty means in memory and is fine.
func checkStatePath(path string) error {
	if path == "" || etcdstore.IsURL(path) {
		return nil // resolveEtcd reads it
	}
	if m := stateURLRE.FindStringSubmatch(path); m != nil {
		if strings.EqualFold(m[1], "etcd") {
			return fmt.Errorf("%q: write the scheme in lower case, %s", clip(path), etcdstore.Scheme)
		}
		return fmt.Errorf("%q looks like a %s:// URL, which is not a state store this build supports; pass a file path such as /var/lib/bigfleet/state, or etcd://HOST:PORT/PREFIX", clip(path), clip(strings.ToLower(m[1])))
	}
	if scheme, _, ok := strings.Cut(path, ":"); ok && strings.EqualFold(scheme, "etcd") {
		return fmt.Errorf("%q looks like an etcd URL but does not start with %s; write etcd://HOST:PORT/PREFIX, or ./%s for a file of that name", clip(path), etcdstore.Scheme, clip(path))
	}
	if m := stateSchemeRE.FindStringSubmatch(path); m != nil {
		return fmt.Errorf("%q looks like a %s: URL, which is not a state store this build supports; pass a file path such as /var/lib/bigfleet/state, or etcd://HOST:PORT/PREFIX (./%s for a file of that name)", clip(path), clip(strings.ToLower(m[1])), clip(path))
	}
	if strings.HasSuffix(path, "/") {
		return fmt.Errorf("%q ends in '/'; name the state file, not its directory, e.g. %q", clip(path), clip(path+"state"))
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return fmt.Errorf("%q is a directory; name the state file inside it, e.g. %q", clip(path), clip(filepath.Join(path, "state")))
	}
	if err := statefile.CheckPath(path); err != nil {
		return fmt.Errorf("%q: %v", clip(path), err)
	}
	return nil
}

// stateSchemeRE matches a --state value that starts like a URL without
// "//": a scheme, a colon and a slash (file:/x, etcd:/x).
var stateSchemeRE = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]*):/`)

// clip bounds a flag value echoed in an error.
func clip(s string) string {
	const limit = 256
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "..."
}

// resolveBackend picks the substrate from the hypervisor's backend flag
// (--libvirt-backend, --proxmox-backend), --use-fake-backend and whether
// the real backend's connection flag is set.
func (f *Flags) resolveBackend(hv pluginFlags, set map[string]bool, p *problems) string {
	b := hv.p.Info().Backend
	realName := b.Real
	name, conn := b.Flag, b.ConnFlag
	value, connSet := hv.f.Backend()
	switch v := strings.ToLower(strings.TrimSpace(value)); v {
	case BackendFake:
		return BackendFake
	case realName:
		if *f.useFake {
			p.add("use-fake-backend", "contradicts --%s=%s; drop one of them", name, realName)
			return BackendFake
		}
		return realName
	case "auto", "":
		switch {
		case *f.useFake:
			return BackendFake
		case connSet:
			return realName
		}
		p.add(name, "is auto but no --%s is set, so there is no real %s to manage: pass --%s to use real %s, or pass --use-fake-backend to run on the built-in simulator",
			conn, b.RealNoun, conn, b.RealNouns)
		return BackendFake
	default:
		p.add(name, "unknown backend %q; use %s, fake or auto", value, realName)
		if *f.useFake {
			return BackendFake
		}
		return realName
	}
}
