package libvirt

import (
	"errors"
	"fmt"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvuri"
	"github.com/bigfleet-vm/provider/retry"
)

// ZoneURI maps a zone (one libvirt host) to its connection URI.
type ZoneURI struct {
	Zone string
	URI  string
	// Pool overrides Config.Pool for this zone (optional).
	Pool string
}

// DefaultCallTimeout is the default bound of one libvirt RPC: well below
// the reconciler's 30 s observe budget, far above what a healthy daemon
// needs (milliseconds; a domain start or destroy under load, seconds).
const DefaultCallTimeout = 10 * time.Second

// Config configures the adapter. Zero durations take the defaults below.
type Config struct {
	Zones []ZoneURI
	// Installation names this provider installation in ownership markers.
	Installation string
	// Pool is the storage pool whose bf- volumes Observe lists (a zone's
	// own pool, ZoneURI.Pool, wins). Everything a VM is built from (image,
	// network, domain type) comes in the planner's specs, which the flags
	// fill: the adapter keeps no defaults of its own.
	Pool string

	// CallTimeout bounds one libvirt RPC, the wait for a request slot
	// included (default DefaultCallTimeout). A guest-agent command gets
	// its own agent wait on top.
	CallTimeout time.Duration
	// UploadTimeout bounds one seed upload stream (default 3 ×
	// CallTimeout); an upload still running then is aborted.
	UploadTimeout time.Duration
	// MaxInFlight is how many RPCs one connection carries at once (default
	// 4): libvirtd serves max_client_requests (default 5) per client and
	// stops reading beyond that, and the liveness probe needs the fifth.
	MaxInFlight int
	// LostAfter is how long a call given up on may stay unanswered before
	// its answer counts as lost (default 2m; libvirtd itself gives up
	// waiting for a domain's job after 30s): when every request slot is
	// held by such calls, the connection is recycled.
	LostAfter time.Duration
	// DialTimeout bounds one connection attempt (default 15s).
	DialTimeout time.Duration
	// MinBackoff and MaxBackoff bound the jittered reconnect backoff
	// after failed dials (200ms, 2s; jitter ±50%); a dropped connection is redialled
	// at once and the backoff resets after every successful dial.
	MinBackoff, MaxBackoff time.Duration
	// ProbeEvery is how often an idle or busy connection is probed with a
	// cheap call (default 1s), and a call that gives up probes at once. A
	// probe unanswered for ProbeTimeout (2s) reports the zone down; one
	// unanswered for DeadAfter (5s) drops the connection, releases every
	// call in flight on it with ErrUnreachable, and redials.
	ProbeEvery, ProbeTimeout, DeadAfter time.Duration
	// PingTimeout bounds one guest-ping (default 5s).
	PingTimeout time.Duration
	// RefreshEvery re-reads a cached domain definition at least this often
	// (default 5m), bounding how stale an out-of-band metadata edit can be.
	RefreshEvery time.Duration
	// MaxOutput bounds the stdout/stderr tail AgentExec keeps (64 KiB).
	MaxOutput int
}

func (c *Config) defaults() {
	if c.CallTimeout <= 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.UploadTimeout <= 0 {
		c.UploadTimeout = 3 * c.CallTimeout
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 4
	}
	if c.LostAfter <= 0 {
		c.LostAfter = 2 * time.Minute
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 15 * time.Second
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = retry.Reconnect.Initial
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = retry.Reconnect.Max
	}
	if c.ProbeEvery <= 0 {
		c.ProbeEvery = time.Second
	}
	if c.ProbeTimeout <= 0 {
		c.ProbeTimeout = 2 * time.Second
	}
	if c.DeadAfter <= c.ProbeTimeout {
		c.DeadAfter = max(5*time.Second, 2*c.ProbeTimeout)
	}
	if c.PingTimeout <= 0 {
		c.PingTimeout = 5 * time.Second
	}
	if c.RefreshEvery <= 0 {
		c.RefreshEvery = 5 * time.Minute
	}
	if c.MaxOutput <= 0 {
		c.MaxOutput = 64 << 10
	}
}

// Validate reports every configuration problem at once.
func (c Config) Validate() error {
	var errs []error
	if c.Installation == "" {
		errs = append(errs, errors.New("installation is empty"))
	}
	if len(c.Zones) == 0 {
		errs = append(errs, errors.New("no zones"))
	}
	seen := map[string]bool{}
	for _, z := range c.Zones {
		if z.Zone == "" {
			errs = append(errs, fmt.Errorf("zone with URI %q has no name", hypervisors.RedactURL(z.URI)))
		}
		if seen[z.Zone] {
			errs = append(errs, fmt.Errorf("zone %q listed twice", z.Zone))
		}
		seen[z.Zone] = true
		if err := lvuri.Check(z.URI); err != nil {
			errs = append(errs, fmt.Errorf("zone %q: %w", z.Zone, err))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("libvirt config: %w: %w", hypervisors.ErrInvalid, errors.Join(errs...))
}
