package server

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/plugin"
)

// simWorld is where the simulator's world comes from and goes to.
type simWorld struct {
	// state holds the persisted world (the state file's records).
	state map[string][]byte
	// store journals the world's changes: the provider's own state store,
	// so the world and the desired document share one journal and a crash
	// never leaves the document ahead of the world. nil without --state.
	store plugin.Journal
	// readOnly refuses every change (provider plan).
	readOnly bool
}

// openHypervisor opens the configured hypervisor: the resolved plug-in's
// real adapter, or its simulator.
func openHypervisor(ctx context.Context, cfg *config.Config, installation string, log *slog.Logger, world simWorld) (hypervisors.Hypervisor, error) {
	if cfg.Plugin == nil {
		return nil, fmt.Errorf("no hypervisor is configured")
	}
	if cfg.Backend != config.BackendFake {
		return cfg.Plugin.Open(ctx, plugin.OpenOptions{Installation: installation, Catalog: cfg.Catalog,
			MaxConcurrentPerZone: cfg.MaxConcurrentPerZone, Logger: log})
	}
	log.Warn("RUNNING ON THE BUILT-IN SIMULATOR: no real VMs are created. This is for development and conformance runs only, never production.",
		"hypervisor", cfg.Hypervisor, "zones", cfg.Zones)
	opts := plugin.SimOptions{Zones: cfg.Zones, Catalog: cfg.Catalog, Latency: cfg.Fake.Latency, Faults: cfg.Fake.Faults,
		SlowOK: cfg.Timeouts.Configure + 30*time.Second, State: world.state, Journal: world.store, ReadOnly: world.readOnly}
	if cfg.Fake.HostCPUs > 0 || cfg.Fake.HostMemoryGiB > 0 {
		opts.Host = hypervisors.HostCapacity{CPUs: cfg.Fake.HostCPUs, MemoryBytes: uint64(cfg.Fake.HostMemoryGiB) << 30}
	}
	return cfg.Plugin.OpenSimulator(opts)
}
