package simcore

import (
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
)

// Store is where a simulator journals its world: the provider's own state
// store, in the same order as the desired document's changes.
type Store interface {
	// Journal queues value under key (nil deletes key) behind everything
	// queued before it. It never waits.
	Journal(key string, value []byte)
}

// Defaults applied by WithDefaults to the simulated guest's commands.
const (
	DefaultBootstrapHook = "/opt/bigfleet/bootstrap"
	DefaultBlobPath      = "/opt/bigfleet/bootstrap.blob"
	DefaultBootstrapPath = "/run/bigfleet-bootstrap"
	DefaultDrainCommand  = "/opt/bigfleet/drain"
	DefaultReadyCommand  = "/opt/bigfleet/node-ready"
	// StatePrefix starts every key a simulator keeps in a state store.
	StatePrefix = "sim/"
)

// Options are the settings every simulator shares; each room's simulator
// embeds them in its own Options next to its hypervisor's settings. The
// zero value is usable.
type Options struct {
	// Zones are the libvirt hosts or Proxmox nodes (default: "fake-a",
	// "fake-b").
	Zones []string

	// The simulated guest's commands (see the package doc).
	BootstrapHook string // default "/opt/bigfleet/bootstrap"
	BlobPath      string // default "/opt/bigfleet/bootstrap.blob"
	BootstrapPath string // Proxmox --bootstrap-path, default "/run/bigfleet-bootstrap"
	DrainCommand  string // default "/opt/bigfleet/drain"
	ReadyCommand  string // default "/opt/bigfleet/node-ready"

	// Latency is added to every hypervisor call, and is the duration of
	// every Proxmox task. 0 is instant. Waiting honours ctx.
	Latency time.Duration
	// AgentDelay is how long a VM must have been running before its guest
	// agent answers.
	AgentDelay time.Duration
	// Faults enables the wire-driven conformance faults: the cluster in a
	// VM's marker ("fault-error", "fault-timeout", "fault-slow-ok",
	// "fault-drain-error", "fault-readiness-block") and the create label
	// conformance.fault/create=error.
	Faults bool
	// SlowOK is how long the "fault-slow-ok" bootstrap runs before it
	// succeeds.
	SlowOK time.Duration

	// Host is every zone's capacity as ReadCapacity reports it, and Hosts
	// a zone's own (it wins). A zone with neither reports a zero
	// HostCapacity: no reading, as an adapter that cannot read it.
	Host  hypervisors.HostCapacity
	Hosts map[string]hypervisors.HostCapacity

	// Hook runs before every hypervisor call; see SetHook.
	Hook Hook

	// Store, when set, journals every change of the world (one record per
	// VM or volume, under StatePrefix). The provider passes its own state
	// store, so the world and the desired document share one journal and a
	// crash can never leave the document ahead of the world.
	Store Store
	// State is a persisted world to start from (the Store's snapshot, or
	// statefile.ReadOnly for provider plan); keys outside StatePrefix are
	// ignored.
	State map[string][]byte
	// ReadOnly makes every mutating call fail with ErrPermission and
	// disables persistence (provider plan against a saved world).
	ReadOnly bool

	// Clock returns the current time (default time.Now). It dates guest
	// uptime, tasks and bootstraps; latency always uses real time.
	Clock func() time.Time
}

// WithDefaults returns o with the shared defaults applied: two zones
// ("fake-a", "fake-b"), the guest's commands, time.Now, and no Store when
// read-only. Each simulator applies its own fields' defaults.
func (o Options) WithDefaults() Options {
	if len(o.Zones) == 0 {
		o.Zones = []string{"fake-a", "fake-b"}
	} else {
		o.Zones = append([]string(nil), o.Zones...)
	}
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&o.BootstrapHook, DefaultBootstrapHook)
	def(&o.BlobPath, DefaultBlobPath)
	def(&o.BootstrapPath, DefaultBootstrapPath)
	def(&o.DrainCommand, DefaultDrainCommand)
	def(&o.ReadyCommand, DefaultReadyCommand)
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.ReadOnly {
		o.Store = nil
	}
	return o
}
