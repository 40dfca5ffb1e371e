// Package lvuri is the libvirt connection-URI policy, once: which
// drivers and transports this provider accepts (Check), how --connect
// names the hosts (ParseConnect, IsBare). The flags (package config) and
// the adapter's Config.Validate both apply it, so a URI one accepts the
// other accepts. It has no dependency on go-libvirt, so the core may
// import it; messages show a URI only through hypervisors.RedactURL,
// which never shows a password.
package lvuri
