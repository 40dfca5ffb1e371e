package server

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/fake"
)

// openHypervisor builds the configured hypervisor adapter.
func openHypervisor(ctx context.Context, cfg *config.Config, installation string, log *slog.Logger) (hypervisors.Hypervisor, error) {
	switch cfg.Backend {
	case config.BackendFake:
		log.Warn("RUNNING ON THE BUILT-IN SIMULATOR: no real VMs are created. This is for development and conformance runs only, never production.",
			"hypervisor", cfg.Hypervisor, "zones", cfg.Zones)
		opts := fake.Options{Zones: cfg.Zones, Latency: cfg.Fake.Latency, Faults: cfg.Fake.Faults,
			SlowOK: cfg.Timeouts.Configure + 30*time.Second}
		if cfg.Hypervisor == hypervisors.ShapeLibvirt {
			opts.Pool, opts.Network = cfg.Libvirt.StoragePool, cfg.Libvirt.Network
			opts.Image = cfg.Libvirt.Image
		} else {
			opts.TemplateVMID, opts.BootstrapPath = cfg.Proxmox.TemplateVMID, cfg.Proxmox.BootstrapPath
			for _, it := range cfg.Catalog {
				if it.TemplateVMID != 0 && it.TemplateVMID != cfg.Proxmox.TemplateVMID {
					opts.Templates = append(opts.Templates, fake.Template{VMID: it.TemplateVMID, Zone: cfg.Zones[0], Name: fmt.Sprintf("template-%d", it.TemplateVMID)})
				}
			}
		}
		if cfg.StatePath != "" {
			// The simulated world lives next to the state file, so a
			// restarted provider finds its VMs again.
			opts.PersistPath = cfg.StatePath + ".fake.json"
			if cfg.Hypervisor == hypervisors.ShapeLibvirt {
				return fake.OpenLibvirt(opts)
			}
			return fake.OpenProxmox(opts)
		}
		if cfg.Hypervisor == hypervisors.ShapeLibvirt {
			return fake.NewLibvirt(opts), nil
		}
		return fake.NewProxmox(opts), nil
	case config.BackendLibvirt:
		return openLibvirt(ctx, cfg, installation, log)
	case config.BackendProxmox:
		return openProxmox(ctx, cfg, installation, log)
	}
	return nil, fmt.Errorf("unknown backend %q", cfg.Backend)
}
