//go:build integration

package libvirt

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
	"github.com/bigfleet-vm/provider/naming"
	"github.com/bigfleet-vm/provider/observed"
)

// itEnv is what scripts/libvirt-up.sh exported (source
// $BIGFLEET_TEST_DIR/env before running the suite).
type itEnv struct {
	URI, Pool, Pool2, Network, Image, ImageRaw, Kernel, Initrd, State string
}

// needEnv returns the substrate, skipping when it is absent on a developer
// machine and failing when CI=true: CI must not pass without a daemon.
func needEnv(t *testing.T) itEnv {
	t.Helper()
	e := itEnv{
		URI: os.Getenv("BIGFLEET_LIBVIRT_URI"), Pool: os.Getenv("BIGFLEET_LIBVIRT_POOL"),
		Pool2: os.Getenv("BIGFLEET_LIBVIRT_POOL2"), Network: os.Getenv("BIGFLEET_LIBVIRT_NETWORK"),
		Image: os.Getenv("BIGFLEET_LIBVIRT_IMAGE"), ImageRaw: os.Getenv("BIGFLEET_LIBVIRT_IMAGE_RAW"),
		Kernel: os.Getenv("BIGFLEET_LIBVIRT_KERNEL"), Initrd: os.Getenv("BIGFLEET_LIBVIRT_INITRD"),
		State: os.Getenv("BIGFLEET_LIBVIRT_STATE"),
	}
	fail := t.Skipf
	if os.Getenv("CI") == "true" {
		fail = t.Fatalf
	}
	if e.URI == "" || e.Pool == "" {
		fail("libvirt substrate not configured: run scripts/libvirt-up.sh and source /var/lib/bigfleet-test/env")
	}
	// The daemon must answer, not just be configured.
	h := newIT(t, e, ZoneURI{Zone: "probe", URI: e.URI})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := h.Observe(ctx, "probe"); err != nil {
		fail("libvirtd at %s not usable: %v", e.URI, err)
	}
	return e
}

// newIT builds an adapter for a fresh random installation and waits for
// the first dial of every zone.
func newIT(t *testing.T, e itEnv, zones ...ZoneURI) *Hypervisor {
	t.Helper()
	return newITInst(t, e, "it-"+randHex(4), zones...)
}

func newITInst(t *testing.T, e itEnv, inst string, zones ...ZoneURI) *Hypervisor {
	t.Helper()
	h, err := New(Config{
		Zones: zones, Installation: inst, Pool: e.Pool, CallTimeout: 30 * time.Second,
		MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second,
	}, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = h.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := h.WaitConnected(ctx); err != nil {
		t.Fatalf("WaitConnected: %v", err)
	}
	return h
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// machine returns names and a marker for one test machine.
type machine struct {
	name, overlay, seed string
	marker              observed.Marker
}

func newMachine(h *Hypervisor, id string) machine {
	name := naming.VMName(h.cfg.Installation, id, 1)
	return machine{
		name: name, overlay: lvspec.OverlayVolume(name), seed: lvspec.SeedVolume(name),
		marker: observed.Marker{Installation: h.cfg.Installation, MachineID: id, OpID: "op-1", InstanceType: "tiny"},
	}
}

// cleanupMachine removes a test machine whatever state it is in.
func cleanupMachine(t *testing.T, h *Hypervisor, zone, pool string, m machine) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		tg := hypervisors.Target{Zone: zone, Name: m.name}
		if err := h.Stop(ctx, tg, 0); err != nil && !errors.Is(err, hypervisors.ErrNotOwned) {
			t.Logf("cleanup stop %s: %v", m.name, err)
		}
		if err := h.UndefineDomain(ctx, tg); err != nil && !errors.Is(err, hypervisors.ErrNotOwned) {
			t.Logf("cleanup undefine %s: %v", m.name, err)
		}
		for _, v := range []string{m.overlay, m.seed} {
			if err := h.DeleteVolume(ctx, zone, pool, v); err != nil {
				t.Logf("cleanup volume %s: %v", v, err)
			}
		}
	})
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// libvirtdArgs is how scripts/libvirt-up.sh starts libvirtd (with
// --listen for the TLS listener); tests that restart the daemon use it.
func libvirtdArgs() []string {
	if a := strings.Fields(os.Getenv("BIGFLEET_LIBVIRTD_ARGS")); len(a) > 0 {
		return a
	}
	return []string{"-d"}
}
