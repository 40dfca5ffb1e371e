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

// simWorld is where the simulator's world comes from and goes to.
type simWorld struct {
	// state holds the persisted world (the state file's records).
	state map[string][]byte
	// store journals the world's changes: the provider's own state store,
	// so the world and the desired document share one journal and a crash
	// never leaves the document ahead of the world. nil without --state.
	store fake.Store
	// readOnly refuses every change (provider plan).
	readOnly bool
}

// openHypervisor builds the configured hypervisor adapter.
func openHypervisor(ctx context.Context, cfg *config.Config, installation string, log *slog.Logger, world simWorld) (hypervisors.Hypervisor, error) {
	switch cfg.Backend {
	case config.BackendFake:
		log.Warn("RUNNING ON THE BUILT-IN SIMULATOR: no real VMs are created. This is for development and conformance runs only, never production.",
			"hypervisor", cfg.Hypervisor, "zones", cfg.Zones)
		opts := fake.Options{Zones: cfg.Zones, Latency: cfg.Fake.Latency, Faults: cfg.Fake.Faults,
			SlowOK: cfg.Timeouts.Configure + 30*time.Second}
		if cfg.Fake.HostCPUs > 0 || cfg.Fake.HostMemoryGiB > 0 {
			opts.Host = hypervisors.HostCapacity{CPUs: cfg.Fake.HostCPUs, MemoryBytes: uint64(cfg.Fake.HostMemoryGiB) << 30}
		}
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
		opts.State, opts.Store, opts.ReadOnly = world.state, world.store, world.readOnly
		if cfg.Hypervisor == hypervisors.ShapeLibvirt {
			return fake.OpenLibvirt(opts)
		}
		return fake.OpenProxmox(opts)
	case config.BackendLibvirt:
		return openLibvirt(ctx, cfg, installation, log)
	case config.BackendProxmox:
		return openProxmox(ctx, cfg, installation, log)
	}
	return nil, fmt.Errorf("unknown backend %q", cfg.Backend)
}
