package server

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox"
)

// openLibvirt connects one go-libvirt client per --connect zone. It never
// blocks on a host: connections are made and re-made in the background,
// and an unreachable host is observed as unknown.
func openLibvirt(_ context.Context, cfg *config.Config, installation string, log *slog.Logger) (hypervisors.Hypervisor, error) {
	lc := libvirt.Config{Installation: installation, Pool: cfg.Libvirt.StoragePool, CallTimeout: cfg.Libvirt.CallTimeout}
	for _, z := range cfg.Libvirt.Connect {
		lc.Zones = append(lc.Zones, libvirt.ZoneURI{Zone: z.Zone, URI: z.URI, Pool: cfg.Libvirt.ZonePools[z.Zone]})
	}
	return libvirt.New(lc, log.With("hypervisor", "libvirt"))
}

// openProxmox builds the go-proxmox adapter and runs the startup
// preflight (API version, nodes, templates, token privileges), which
// reports every problem at once.
func openProxmox(ctx context.Context, cfg *config.Config, installation string, log *slog.Logger) (hypervisors.Hypervisor, error) {
	x := cfg.Proxmox
	a, err := proxmox.New(proxmox.Config{APIURL: x.APIURL, TokenID: x.TokenID, TokenSecret: x.TokenSecret.Reveal(),
		CAFile: x.CAFile, Fingerprint: x.Fingerprint, Pool: x.Pool, Nodes: x.Nodes, Installation: installation,
		CloneConcurrency: cfg.MaxConcurrentPerZone, PollInterval: pollInterval(x.PollInterval)}, log.With("hypervisor", "proxmox"))
	if err != nil {
		return nil, err
	}
	seen := map[int]bool{}
	var templates []int
	for _, name := range cfg.Catalog.Names() {
		if v := cfg.Catalog[name].TemplateVMID; v != 0 && !seen[v] {
			seen[v] = true
			templates = append(templates, v)
		}
	}
	pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := a.Preflight(pctx, templates); err != nil {
		a.Close()
		return nil, fmt.Errorf("proxmox preflight: %w", err)
	}
	return a, nil
}

// pollInterval maps --proxmox-poll-interval to the adapter's setting, where
// a negative interval turns the poller off.
func pollInterval(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
