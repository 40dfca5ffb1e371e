package server

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/planner"
)

// readDir returns every file's bytes under dir.
func readDir(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = b
	}
	return out
}

// TestOfflinePlanReadOnly plans against the state file and simulator
// world of a provider that is running (holding the state lock), and
// checks the plan and that not one byte on disk changed.
func TestOfflinePlanReadOnly(t *testing.T) {
	for _, shape := range []string{"libvirt", "proxmox"} {
		t.Run(shape, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			state := filepath.Join(dir, "state")
			cfg, err := config.Parse(testReg, []string{"--use-fake-backend", "--hypervisor", shape, "--state", state, "--seed-count", "2",
				"--installation-id", "plan-test", "--addr", "127.0.0.1:0", "--metrics-addr", ""}, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			p, err := Build(ctx, cfg, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			id := cfg.Slots[0].ID
			if _, err := p.current().doc.Mutate(ctx, desired.Request{Kind: desired.KindCreate, MachineID: id}); err != nil {
				t.Fatal(err)
			}
			mk := observed.Marker{Installation: "plan-test", MachineID: "orphan-1", InstanceType: cfg.Slots[0].Type.Name}
			sim := hypervisors.CapabilitiesOf(p.current().raw).Simulator
			if err := sim.AddOwned(hypervisors.Target{Zone: cfg.Zones[0], Name: "bf-plan-test-orphan-1"}, mk); err != nil {
				t.Fatal(err)
			}
			// The simulator journals into the state store: wait until the
			// orphan is on disk.
			flushed := make(chan error, 1)
			p.current().store.Commit(nil, func(err error) { flushed <- err }) // a barrier: done runs in commit order
			if err := <-flushed; err != nil {
				t.Fatal(err)
			}
			before := readDir(t, dir)

			plan, err := OfflinePlan(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(before, readDir(t, dir)); diff != "" {
				t.Errorf("offline plan changed files on disk (-before +after):\n%s", diff)
			}
			got := map[string]string{}
			for _, c := range plan.Changes {
				switch {
				case c.Adopt != nil:
					got[c.Machine] = "adopt"
				case c.Intent != nil:
					got[c.Machine] = c.Intent.Kind
				}
			}
			if diff := cmp.Diff(map[string]string{id: "create", "orphan-1": "adopt"}, got); diff != "" {
				t.Errorf("plan changes (-want +got):\n%s", diff)
			}
			if plan.Summary.Create != 1 || plan.Summary.Adopt != 1 || plan.Installation != "plan-test" {
				t.Errorf("summary %+v installation %q", plan.Summary, plan.Installation)
			}
			var text bytes.Buffer
			if err := planner.WriteText(&text, plan, planner.TextOptions{}); err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(text.Bytes(), []byte("Plan: 1 to create, 0 to configure, 0 to drain, 0 to delete, 1 to adopt; 1 drift.")) {
				t.Errorf("text plan:\n%s", text.String())
			}
		})
	}
}

// TestOfflinePlanWithoutState plans from the offerings alone: every slot
// is SPECULATIVE and the simulator world is empty, so nothing changes.
func TestOfflinePlanWithoutState(t *testing.T) {
	cfg, err := config.Parse(testReg, []string{"--use-fake-backend", "--seed-count", "3", "--addr", "127.0.0.1:0", "--metrics-addr", ""}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := OfflinePlan(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if plan.HasChanges() || len(plan.Drift) != 0 || len(plan.Zones) != len(cfg.Zones) {
		t.Errorf("plan without state: %+v", plan)
	}
}
