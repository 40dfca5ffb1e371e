package libvirt

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
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
			errs = append(errs, fmt.Errorf("zone with URI %q has no name", redactURI(z.URI)))
		}
		if seen[z.Zone] {
			errs = append(errs, fmt.Errorf("zone %q listed twice", z.Zone))
		}
		seen[z.Zone] = true
		if _, err := ParseURI(z.URI); err != nil {
			errs = append(errs, fmt.Errorf("zone %q: %w", z.Zone, err))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("libvirt config: %w: %w", hypervisors.ErrInvalid, errors.Join(errs...))
}

// ParseZones parses "uri" (one zone named defaultZone) or a comma-separated
// "zone=uri,zone=uri" list.
func ParseZones(s, defaultZone string) ([]ZoneURI, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, fmt.Errorf("empty connect list: %w", hypervisors.ErrInvalid)
	}
	if !strings.Contains(strings.SplitN(s, ":", 2)[0], "=") {
		return []ZoneURI{{Zone: defaultZone, URI: s}}, nil
	}
	var out []ZoneURI
	for _, part := range strings.Split(s, ",") {
		zone, uri, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || zone == "" || uri == "" {
			return nil, fmt.Errorf("connect entry %q is not zone=uri: %w", redactURI(part), hypervisors.ErrInvalid)
		}
		out = append(out, ZoneURI{Zone: zone, URI: uri})
	}
	return out, nil
}

// ParseURI parses a libvirt URI and applies the transport policy: tcp
// (unauthenticated, unencrypted) is refused, host-key and certificate
// verification may not be switched off, and the options go-libvirt ignores
// on a transport are refused rather than silently dropped.
func ParseURI(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("parse URI: %w", hypervisors.ErrInvalid)
	}
	if u.Scheme == "" {
		return nil, fmt.Errorf("URI %q has no scheme: %w", redactURI(raw), hypervisors.ErrInvalid)
	}
	driver, transport, _ := strings.Cut(u.Scheme, "+")
	if transport == "" && u.Host != "" {
		transport = "tls"
	}
	switch driver {
	case "qemu", "test":
	default:
		return nil, fmt.Errorf("URI %q: driver %q unsupported: %w", redactURI(raw), driver, hypervisors.ErrInvalid)
	}
	q := u.Query()
	truthy := func(k string) bool { v := q.Get(k); return v != "" && v != "0" }
	switch transport {
	case "", "unix":
	case "tcp":
		return nil, fmt.Errorf("URI %q: tcp transport is unauthenticated and unencrypted: %w", redactURI(raw), hypervisors.ErrInvalid)
	case "tls":
		if truthy("no_verify") {
			return nil, fmt.Errorf("URI %q: no_verify is refused: %w", redactURI(raw), hypervisors.ErrInvalid)
		}
	case "ssh":
		if truthy("no_verify") {
			return nil, fmt.Errorf("URI %q: no_verify is refused: %w", redactURI(raw), hypervisors.ErrInvalid)
		}
		for _, k := range []string{"known_hosts", "known_hosts_verify", "sshauth"} {
			if q.Get(k) != "" {
				return nil, fmt.Errorf("URI %q: %s is ignored on ssh, use qemu+libssh: %w", redactURI(raw), k, hypervisors.ErrInvalid)
			}
		}
	case "libssh", "libssh2":
		switch q.Get("known_hosts_verify") {
		case "", "normal":
		default:
			return nil, fmt.Errorf("URI %q: known_hosts_verify must be normal: %w", redactURI(raw), hypervisors.ErrInvalid)
		}
		if q.Get("no_verify") != "" {
			return nil, fmt.Errorf("URI %q: no_verify is refused: %w", redactURI(raw), hypervisors.ErrInvalid)
		}
	default:
		return nil, fmt.Errorf("URI %q: transport %q unsupported: %w", redactURI(raw), transport, hypervisors.ErrInvalid)
	}
	return u, nil
}

// redactURI drops a password from a URI so it can appear in messages.
func redactURI(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparsable>"
	}
	return u.Redacted()
}
