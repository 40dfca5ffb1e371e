package server

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/bigfleet-vm/provider/capacity"
	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/jsonplan"
	"github.com/bigfleet-vm/provider/planner"
	"github.com/bigfleet-vm/provider/reconciler"
)

// OfflinePlan computes what the next reconcile would do, the way `provider
// plan` does without a running server: it reads the state file without
// its lock (statefile.ReadOnly, safe while a server has it open), builds
// the desired document in memory, observes the hypervisors read-only and
// plans. It never writes anything: not the state file, not the
// simulator's saved world, not a hypervisor.
//
// Machines are planned as stored, intents included, so the plan shows
// what a running server would do next (a restarted server would first
// fail interrupted Configures, whose blobs are not stored). Slots the
// offerings add are planned as fresh SPECULATIVE machines, as Open would
// add them. With no state file the inventory is the offerings' slots.
func OfflinePlan(ctx context.Context, cfg *config.Config) (*planner.Plan, error) {
	p, _, err := offlinePlan(ctx, cfg, false)
	return p, err
}

// OfflinePlanJSON is OfflinePlan in its published form, with the capacity
// section `provider plan` shows: unless --capacity-check is off, every
// zone's host is read now, with the bounded read the full pass uses, and
// held against the zone's offerings and running machines. A zone whose
// host cannot be read says why; nothing is invented for it.
func OfflinePlanJSON(ctx context.Context, cfg *config.Config) (*jsonplan.Plan, error) {
	p, c, err := offlinePlan(ctx, cfg, cfg.CapacityCheck != config.CapacityOff)
	if err != nil {
		return nil, err
	}
	out := p.JSON()
	out.Capacity = c
	return out, nil
}

func offlinePlan(ctx context.Context, cfg *config.Config, readCapacity bool) (*planner.Plan, *jsonplan.Capacity, error) {
	// What the leader committed (etcd) or the journal's committed records,
	// without campaigning, locking or writing.
	stored, err := readStored(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	if stored == nil {
		stored = map[string][]byte{}
	}
	// Inspect validates the stored document against the flags
	// (installation, zones and types of known ids) and adds the slots the
	// offerings would add, without writing anything.
	view, err := desired.Inspect(stored, docOptions(cfg, nil), desiredSlots(cfg))
	if err != nil {
		return nil, nil, err
	}
	if cfg.Etcd != nil && view.Fresh {
		// As with a missing state file: a typo in the prefix must not look
		// like the clean plan of a fresh installation.
		return nil, nil, fmt.Errorf("--state %s: no desired state under prefix %s (a provider writes it when it first leads); check the prefix", cfg.StatePath, cfg.Etcd.Prefix)
	}

	hv, err := openReadOnly(ctx, cfg, view.Installation, stored)
	if err != nil {
		return nil, nil, err
	}
	defer hv.Close()
	pc := plannerConfig(cfg, view.Installation)
	rec := reconciler.New(reconciler.Options{Hypervisor: hv, Planner: pc})
	snap := rec.ObserveAll(ctx)
	var section *jsonplan.Capacity
	if readCapacity {
		types := catalogSpec(cfg)
		latest := &capacity.Latest{}
		cr, canRead := hypervisors.Find[hypervisors.CapacityReader](hv)
		if canRead {
			hosts, errs := capacity.Read(ctx, cr, hv.Zones(), capacityReadTimeout)
			latest.Record(hv.Zones(), hosts, errs, time.Now())
		}
		section = capacitySection(hv.Zones(), canRead, latest, view.Machines, types, cfg.CapacityOvercommit)
	}
	return planner.Build(planner.Inputs{Config: pc, Machines: view.Machines, Observed: snap,
		Lineage: view.Lineage, Serial: view.Serial, Now: time.Now()}), section, nil
}

// openReadOnly opens the configured hypervisor for observation only. The
// simulator's world is the one a server journaled in the state file,
// loaded read-only; without --state it is a fresh, empty world. A real
// adapter gets a bounded wait for its connections, so a reachable host is
// observed rather than reported unknown for not being dialled yet.
func openReadOnly(ctx context.Context, cfg *config.Config, installation string, stored map[string][]byte) (hypervisors.Hypervisor, error) {
	hv, err := openHypervisor(ctx, cfg, installation, slog.New(slog.DiscardHandler), simWorld{state: stored, readOnly: true})
	if err != nil {
		return nil, err
	}
	if w, ok := hv.(interface{ WaitConnected(context.Context) error }); ok {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_ = w.WaitConnected(wctx) // hosts still down are observed as unknown
	}
	return hv, nil
}
