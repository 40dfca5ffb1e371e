package plugin

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/inventory"
	"github.com/bigfleet-vm/provider/planner"
)

// Plugin is one hypervisor, as its package registers it.
type Plugin interface {
	Info() Info
	// RegisterFlags defines the plug-in's flags on fs and returns their
	// values, to be resolved once fs is parsed.
	RegisterFlags(fs *flag.FlagSet) Flags
}

// Info is what the core says about a hypervisor without asking which one
// it is.
type Info struct {
	// Name is the --hypervisor value, the plan's "hypervisor" and the
	// default --provider (^[a-z][a-z0-9-]{0,31}$).
	Name string
	// Title names the hypervisor in messages ("libvirt", "Proxmox").
	Title string
	// FlagGroup is the title of the plug-in's group in the usage, e.g.
	// "Proxmox connection and clone parameters".
	FlagGroup string
	// DefaultZone is the --default-zone default ("local", "pve").
	DefaultZone string
	// CreateTimeout is the --create-timeout default.
	CreateTimeout time.Duration
	// Backend is what the backend choice reads and says.
	Backend Backend
}

// Backend names the flags that choose between the hypervisor's real
// backend and the simulator, and how a refusal names the real one:
// e.g. {"proxmox-backend", "proxmox-api-url", "Proxmox cluster",
// "Proxmox"}.
type Backend struct {
	// Flag is the backend flag (Real, fake or auto).
	Flag string
	// Real is the backend flag's value that picks the real substrate
	// (the hypervisor's own name, by convention).
	Real string
	// ConnFlag is the flag that, when set, makes auto pick the real
	// backend.
	ConnFlag string
	// RealNoun and RealNouns complete "no real %s to manage" and "to use
	// real %s".
	RealNoun, RealNouns string
}

// Flags are one plug-in's flag values, registered on a FlagSet.
type Flags interface {
	// Names are the plug-in's flags, in the order a message lists them;
	// setting one of them selects this hypervisor when --hypervisor is
	// not given.
	Names() []string
	// Usage are the same flags in the order the usage lists them.
	Usage() []string
	// Bounds are the plug-in's rows of the bounded numeric flags' tables.
	Bounds() Bounds
	// Backend is the value of Info.Backend.Flag and whether
	// Info.Backend.ConnFlag is set (non-blank).
	Backend() (value string, connSet bool)
	// ReportsDefaultZone is true when the plug-in reports an unusable
	// --default-zone itself (libvirt: a bare --connect URI names its
	// zone with it), so the core does not report it twice.
	ReportsDefaultZone(set map[string]bool) bool
	// Resolve validates the flags, adding every problem to p, and returns
	// the resolved hypervisor.
	Resolve(env Env, p Problems) Resolved
}

// Env is what a plug-in's resolution knows of the rest of the
// configuration.
type Env struct {
	// Set holds the names of the flags given on the command line.
	Set map[string]bool
	// Real is true when the real backend is selected (not the simulator).
	Real bool
	// DefaultZone is the resolved --default-zone.
	DefaultZone string
	// Now dates certificate checks.
	Now time.Time
}

// Problems collects configuration errors, each led by its flag.
type Problems interface {
	// Add adds a problem with --flag.
	Add(flag, format string, args ...any)
	// AddErr adds err under --flag, one entry per problem if err is a
	// list.
	AddErr(flag string, err error)
	// Duration and Integer check a bounded flag's value against the
	// merged bounds table, add a problem when it is outside, and report
	// whether it is inside.
	Duration(flag string, d time.Duration) bool
	Integer(flag string, n int) bool
	// CABundle checks a PEM CA bundle the plug-in trusts: a problem
	// under --flag if it can verify nothing; its expiry warnings are
	// logged at start.
	CABundle(flag, file string)
}

// Resolved is a hypervisor whose flags resolved: everything the core
// needs from it.
type Resolved interface {
	// Zones are the real backend's zones in order (nil unless the real
	// backend is selected and they parsed cleanly) and the flag that
	// names them ("connect", "nodes").
	Zones() (zones []string, flag string)
	// Capacity is the capacity type of the default offerings.
	Capacity() inventory.CapacityType
	// Catalog are the rules of the hypervisor's instance types.
	Catalog() inventory.CatalogRules
	// CapacityRules are the capacity types it offers.
	CapacityRules() inventory.CapacityRules
	// Certs are the client certificate chains the real backend presents,
	// checked at start.
	Certs() []CertFile
	// Summary describes the settings for people (a text of " key=value"
	// pairs) and for logs; it never holds a secret.
	Summary() (text string, attrs []slog.Attr)
	// Planner is the hypervisor's planning half.
	Planner(o PlannerOptions) planner.Plugin
	// Open connects the real adapter.
	Open(ctx context.Context, o OpenOptions) (hypervisors.Hypervisor, error)
	// OpenSimulator opens the built-in simulator; it has the Simulator
	// capability.
	OpenSimulator(o SimOptions) (hypervisors.Hypervisor, error)
}

// CertFile is a client certificate chain a backend presents, checked at
// start like the provider's own: a problem under --Flag, worded
// "<Context>: cannot load the <Noun> keypair ..." or "<Context>: <Noun>
// certificate ...".
type CertFile struct {
	Flag, Role, Cert, Key string
	Context, Noun         string
}

// PlannerOptions are what the planner's settings depend on besides the
// flags.
type PlannerOptions struct {
	// Simulated: the simulator is selected (its defaults fill settings
	// the real backend requires).
	Simulated bool
}

// OpenOptions are what opening a real adapter needs besides the flags.
type OpenOptions struct {
	Installation string
	// Catalog are the instance types (their templates are preflighted).
	Catalog              inventory.Catalog
	MaxConcurrentPerZone int
	Logger               *slog.Logger
}

// Journal is where a simulator journals its world: the provider's own
// state store.
type Journal interface {
	// Journal queues value under key (nil deletes key) behind everything
	// queued before it. It never waits.
	Journal(key string, value []byte)
}

// SimOptions are what opening the simulator needs besides the flags.
type SimOptions struct {
	Zones []string
	// Catalog are the instance types (extra templates are placed).
	Catalog inventory.Catalog
	Latency time.Duration
	// SlowOK is how long the conformance "fault-slow-ok" bootstrap runs.
	SlowOK time.Duration
	Faults bool
	// Host is every simulated host's capacity (zero: no reading).
	Host hypervisors.HostCapacity
	// State is a saved world; Journal (nil: none) journals changes;
	// ReadOnly refuses every change.
	State    map[string][]byte
	Journal  Journal
	ReadOnly bool
}

// SimReadyCommand is the in-guest readiness probe every simulator's guest
// answers (the conformance fault convention's readiness gate).
const SimReadyCommand = "/opt/bigfleet/node-ready"

// Commander is implemented by plug-ins that add subcommands to the
// provider binary.
type Commander interface {
	Commands() []Command
}

// Command is one subcommand a plug-in adds.
type Command struct {
	// Name is the subcommand; What its one-line description in help.
	Name, What string
	// Run runs it with args (after the name) and returns the exit code.
	Run func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}
