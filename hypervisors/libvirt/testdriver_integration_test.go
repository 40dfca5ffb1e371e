//go:build integration

package libvirt

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
)

// test:///default is reachable through the daemon's socket (go-libvirt
// asks libvirtd to open it). It covers fast error paths: no agent, no
// upload, no NVRAM undefine flag, and synchronous shutdown.
func TestIntegrationTestDriver(t *testing.T) {
	e := needEnv(t)
	h := newIT(t, e, ZoneURI{Zone: "t", URI: "test:///default"})
	h.cfg.Pool = "default-pool"
	ctx := ctxT(t, time.Minute)
	m := newMachine(h, "td-1")
	tg := hypervisors.Target{Zone: "t", Name: m.name}

	if _, err := h.Observe(ctx, "t"); err != nil {
		t.Fatalf("Observe: %v", err)
	}
	spec := smallSpec("default-pool", m)
	spec.Network = "default"
	if err := h.DefineDomain(ctx, "t", spec); err != nil {
		t.Fatalf("DefineDomain: %v", err)
	}
	if err := h.Start(ctx, tg); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := h.AgentPing(ctx, tg); err == nil || errors.Is(err, hypervisors.ErrAgentNotReady) {
		t.Errorf("AgentPing on the test driver: %v, want a terminal (unsupported) error", err)
	} else if !errors.Is(err, hypervisors.ErrUnsupported) {
		t.Logf("AgentPing on the test driver: %v", err)
	}
	if err := h.CreateSeed(ctx, "t", lvspec.SeedSpec{Pool: "default-pool", Name: m.seed, InstanceID: "x", Hostname: "x"}); !errors.Is(err, hypervisors.ErrUnsupported) {
		t.Errorf("CreateSeed (upload) on the test driver: %v, want ErrUnsupported", err)
	}
	if err := h.Stop(ctx, tg, 2*time.Second); err != nil {
		t.Errorf("Stop: %v", err)
	}
	// The NVRAM flag is rejected here: the fallback must undefine anyway.
	if err := h.UndefineDomain(ctx, tg); err != nil {
		t.Errorf("UndefineDomain: %v", err)
	}
	if _, err := h.Lookup(ctx, tg); !errors.Is(err, hypervisors.ErrNotFound) {
		t.Errorf("Lookup after undefine: %v, want ErrNotFound", err)
	}
	if err := h.Start(ctx, tg); !errors.Is(err, hypervisors.ErrNotFound) {
		t.Errorf("Start of a missing domain: %v, want ErrNotFound", err)
	}
	if err := h.UndefineDomain(ctx, tg); err != nil {
		t.Errorf("UndefineDomain of a missing domain: %v", err)
	}
	if err := h.DeleteVolume(ctx, "t", "default-pool", "bf-missing"); err != nil {
		t.Errorf("DeleteVolume of a missing volume: %v", err)
	}
}

// TestIntegrationOwnersStayFlat defines and undefines many domains on a
// real daemon (the test driver) between listings, then lists: the owner
// notes of the domains that came and went are gone (issue 18: the map
// kept one per domain ever defined between two listings).
func TestIntegrationOwnersStayFlat(t *testing.T) {
	e := needEnv(t)
	h := newIT(t, e, ZoneURI{Zone: "t", URI: "test:///default"})
	h.cfg.Pool = "default-pool"
	ctx := ctxT(t, 2*time.Minute)
	ownerCount := func() int {
		h.ownersMu.Lock()
		defer h.ownersMu.Unlock()
		return len(h.owners)
	}
	if _, err := h.Observe(ctx, "t"); err != nil {
		t.Fatalf("Observe: %v", err)
	}
	base := ownerCount()
	const rounds, perRound = 5, 20
	for r := range rounds {
		for i := range perRound {
			m := newMachine(h, fmt.Sprintf("own-%d-%d", r, i))
			spec := smallSpec("default-pool", m)
			spec.Network = "default"
			if err := h.DefineDomain(ctx, "t", spec); err != nil {
				t.Fatalf("DefineDomain: %v", err)
			}
			if err := h.UndefineDomain(ctx, hypervisors.Target{Zone: "t", Name: m.name}); err != nil {
				t.Fatalf("UndefineDomain: %v", err)
			}
		}
		if n := ownerCount(); n < base+perRound {
			t.Logf("round %d: %d notes before the listing", r, n)
		}
		if _, err := h.Observe(ctx, "t"); err != nil {
			t.Fatalf("Observe: %v", err)
		}
		if n := ownerCount(); n != base {
			t.Fatalf("round %d: %d owner notes after the listing, want %d (the domains defined and undefined since the last one stay noted)", r, n, base)
		}
	}
}
