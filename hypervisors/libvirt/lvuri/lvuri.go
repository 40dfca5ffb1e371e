package lvuri

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/inventory"
	"github.com/hashicorp/go-multierror"
)

// ZoneURI maps one zone to the libvirt host that serves it.
type ZoneURI struct {
	Zone, URI string
}

// ParseConnect parses --connect. A value with no '=', or whose text before
// the first '=' contains ':', is one bare URI for defaultZone; anything
// else is a comma-separated list of zone=uri entries, split on each
// entry's first '=' (so URIs in a list cannot contain commas). Every URI
// must pass Check. Every problem is reported.
func ParseConnect(s, defaultZone string) ([]ZoneURI, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var errs *multierror.Error
	if IsBare(s) {
		if err := inventory.ValidateZone(defaultZone); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("the bare URI goes to --default-zone, but %v", err))
		}
		if err := Check(s); err != nil {
			errs = multierror.Append(errs, err)
		}
		if errs != nil {
			return nil, errs
		}
		return []ZoneURI{{Zone: defaultZone, URI: s}}, nil
	}
	var out []ZoneURI
	seen := map[string]bool{}
	for entry := range strings.SplitSeq(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		zone, uri, found := strings.Cut(entry, "=")
		zone, uri = strings.TrimSpace(zone), strings.TrimSpace(uri)
		switch {
		case !found:
			errs = multierror.Append(errs, fmt.Errorf("entry %q has no '=': write zone=uri, e.g. rack1=qemu+libssh://bigfleet@host-a/system", hypervisors.RedactURL(entry)))
			continue
		case zone == "":
			errs = multierror.Append(errs, fmt.Errorf("entry %q has an empty zone before '='", hypervisors.RedactURL(entry)))
			continue
		case uri == "":
			errs = multierror.Append(errs, fmt.Errorf("zone %q has an empty URI after '='", zone))
			continue
		}
		if err := inventory.ValidateZone(zone); err != nil {
			errs = multierror.Append(errs, err)
			continue
		}
		if seen[zone] {
			errs = multierror.Append(errs, fmt.Errorf("zone %q is listed twice; each zone is one host, keep one entry", zone))
			continue
		}
		seen[zone] = true
		if err := Check(uri); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("zone %q: %w", zone, err))
			continue
		}
		out = append(out, ZoneURI{Zone: zone, URI: uri})
	}
	if errs != nil {
		return nil, errs
	}
	return out, nil
}

// Check parses a libvirt connection URI and refuses drivers this
// provider does not drive and transports that are insecure or that the
// pure-Go client would silently mis-handle:
//   - drivers: qemu (/system or /session) and test (libvirt's test driver);
//   - local: qemu:///system, qemu:///session, qemu+unix://, test:///...;
//   - qemu+tcp and any unknown transport are refused;
//   - tls (qemu+tls://, or a bare remote URI): no truthy no_verify;
//   - ssh: no truthy no_verify, and no known_hosts, known_hosts_verify or
//     sshauth (the client honours them only on libssh);
//   - libssh/libssh2: no no_verify, and known_hosts_verify empty or normal.
func Check(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("URI %q does not parse: %v", hypervisors.RedactURL(raw), urlErrorReason(err))
	}
	shown := u.Redacted()
	if u.Scheme == "" {
		return fmt.Errorf("URI %q has no scheme; write e.g. qemu:///system or qemu+libssh://user@host/system", shown)
	}
	if u.Opaque != "" {
		return fmt.Errorf("URI %q is not of the form driver[+transport]://[user@][host]/path", shown)
	}
	driver, transport, _ := strings.Cut(strings.ToLower(u.Scheme), "+")
	switch driver {
	case "qemu":
		if u.Path != "/system" && u.Path != "/session" {
			return fmt.Errorf("URI %q has path %q; a qemu URI ends in /system or /session", shown, u.Path)
		}
	case "test":
		if u.Path == "" || u.Path == "/" {
			return fmt.Errorf("URI %q names no test driver configuration; use test:///default", shown)
		}
	default:
		return fmt.Errorf("URI %q uses driver %q; this provider drives QEMU/KVM domains (qemu://...) or libvirt's test driver (test:///default)", shown, driver)
	}
	if transport == "" {
		transport = "unix"
		if u.Host != "" {
			transport = "tls"
		}
	}
	q := u.Query()
	truthy := func(k string) bool { v := q.Get(k); return v != "" && v != "0" }
	if transport != "unix" && u.Hostname() == "" {
		return fmt.Errorf("URI %q uses the %s transport but names no host", shown, transport)
	}
	switch transport {
	case "unix":
		if u.Host != "" {
			return fmt.Errorf("URI %q uses the local unix socket but names host %q; drop the host or use qemu+libssh://", shown, u.Host)
		}
	case "tcp":
		return fmt.Errorf("URI %q uses plain TCP, which carries libvirt RPC (and the bootstrap blob) unauthenticated and unencrypted; use qemu+tls:// or qemu+libssh://", shown)
	case "tls":
		if truthy("no_verify") {
			return fmt.Errorf("URI %q sets no_verify, which disables verification of the host's TLS certificate; remove it and trust the host's CA via pkipath", shown)
		}
	case "ssh":
		if truthy("no_verify") {
			return fmt.Errorf("URI %q sets no_verify, which disables SSH host-key checking; remove it", shown)
		}
		var bad []string
		for _, k := range []string{"known_hosts", "known_hosts_verify", "sshauth"} {
			if q.Get(k) != "" {
				bad = append(bad, k)
			}
		}
		if len(bad) > 0 {
			return fmt.Errorf("URI %q sets %s, which the pure-Go client honours only on the libssh transport; use qemu+libssh:// instead", shown, strings.Join(bad, ", "))
		}
	case "libssh", "libssh2":
		if q.Get("no_verify") != "" {
			return fmt.Errorf("URI %q sets no_verify, which the libssh transport does not accept; remove it and pin the host key with known_hosts", shown)
		}
		if v := q.Get("known_hosts_verify"); v != "" && v != "normal" {
			return fmt.Errorf("URI %q sets known_hosts_verify=%s, which disables or weakens SSH host-key checking; use known_hosts_verify=normal with a known_hosts file", shown, v)
		}
	default:
		return fmt.Errorf("URI %q uses transport %q, which is unknown or insecure; use qemu:///system (local), qemu+libssh:// or qemu+tls://", shown, transport)
	}
	return nil
}

// urlErrorReason drops the *url.Error wrapper, which repeats the URI.
func urlErrorReason(err error) error {
	if ue, ok := err.(*url.Error); ok {
		return ue.Err
	}
	return err
}

// IsBare reports whether a --connect value is one URI rather than a
// zone=uri list: it has no '=', or the text before its first '=' contains
// ':' (the '=' belongs to the URI's query).
func IsBare(s string) bool {
	before, _, found := strings.Cut(strings.TrimSpace(s), "=")
	return !found || strings.Contains(before, ":")
}
