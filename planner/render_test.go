package planner_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/planner"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func render(t *testing.T, p *planner.Plan, color bool) string {
	t.Helper()
	var b bytes.Buffer
	if err := planner.WriteText(&b, p, planner.TextOptions{Color: color}); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestRenderSummaryLine(t *testing.T) {
	tests := []struct {
		name string
		sum  planner.Summary
		want string
	}{
		{"basic", planner.Summary{Create: 3, Configure: 1, Delete: 2, Drift: 1}, "Plan: 3 to create, 1 to configure, 0 to drain, 2 to delete; 1 drift."},
		{"extended", planner.Summary{Create: 1, Repair: 2, Fail: 1, Adopt: 3, Drift: 6}, "Plan: 1 to create, 0 to configure, 0 to drain, 0 to delete, 2 to repair, 1 to fail, 3 to adopt; 6 drift."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &planner.Plan{FormatVersion: planner.FormatVersion, Summary: tt.sum,
				Changes: []planner.Change{{Machine: "m", Zone: "z", State: "CREATING", Finish: "IDLE"}}}
			lines := strings.Split(strings.TrimSpace(render(t, p, false)), "\n")
			if diff := cmp.Diff(tt.want, lines[len(lines)-1]); diff != "" {
				t.Errorf("summary (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRenderNoChanges(t *testing.T) {
	p := planner.Build(planner.Inputs{Config: planner.Config{Shape: hypervisors.ShapeLibvirt, Installation: "i"},
		Observed: &observed.Snapshot{Zones: map[string]*observed.Zone{"a": {Name: "a", Status: observed.StatusOK, At: t0}}, At: t0}, Now: t0})
	out := render(t, p, false)
	if !strings.HasSuffix(out, "\nNo changes.\n") {
		t.Errorf("empty plan renders as:\n%s", out)
	}
}

func TestRenderColorOnlyWhenAsked(t *testing.T) {
	p := &planner.Plan{FormatVersion: planner.FormatVersion, Summary: planner.Summary{Delete: 1},
		Changes: []planner.Change{{Machine: "m", Zone: "z", State: "DELETING", Intent: &planner.Intent{Kind: "delete", OpID: "op-5"},
			Steps: []planner.Step{{ID: "z/vm/undefine", Action: planner.ActionUndefine, Reason: "intent:delete"}}, Finish: "SPECULATIVE"}}}
	plain, colored := render(t, p, false), render(t, p, true)
	if strings.Contains(plain, "\x1b[") {
		t.Errorf("plain text carries ANSI escapes:\n%q", plain)
	}
	if !strings.Contains(colored, "\x1b[31m-\x1b[0m") {
		t.Errorf("coloured text lacks a red destroy symbol:\n%q", colored)
	}
	if !strings.Contains(plain, "# m (z, DELETING): Delete op-5\n  - z/vm/undefine  (intent:delete)\n  => SPECULATIVE\n") {
		t.Errorf("block:\n%s", plain)
	}
}

func TestRenderHeadlines(t *testing.T) {
	tests := []struct {
		c    planner.Change
		want string
	}{
		{planner.Change{Intent: &planner.Intent{Kind: "create", OpID: "op-12"}}, "Create op-12"},
		{planner.Change{Intent: &planner.Intent{Kind: "configure", OpID: "op-3", Cluster: "c1"}}, "Configure op-3 cluster=c1"},
		{planner.Change{Intent: &planner.Intent{Kind: "drain", OpID: "op-4", Grace: 30}}, "Drain op-4 grace=30s"},
		{planner.Change{Intent: &planner.Intent{Kind: "delete", OpID: "op-5"}}, "Delete op-5"},
		{planner.Change{Steps: []planner.Step{{ID: "z/v/start", Action: planner.ActionStart}}}, "repair"},
		{planner.Change{Fail: "VM gone"}, "FAILED: VM gone"},
		{planner.Change{Intent: &planner.Intent{Kind: "create", OpID: "op-1"}, Fail: "create timed out after 5m0s"}, "Create op-1 -> FAILED: create timed out after 5m0s"},
		{planner.Change{Adopt: &planner.Adopt{Host: "z/v", VMName: "v"}}, "adopt"},
	}
	for _, tt := range tests {
		c := tt.c
		c.Machine, c.Zone, c.State = "m", "z", "X"
		p := &planner.Plan{FormatVersion: planner.FormatVersion, Changes: []planner.Change{c}}
		if out := render(t, p, false); !strings.Contains(out, "# m (z, X): "+tt.want+"\n") {
			t.Errorf("want headline %q in:\n%s", tt.want, out)
		}
	}
}

func TestRenderRejectsOtherMajorVersion(t *testing.T) {
	var b bytes.Buffer
	if err := planner.RenderText(&b, []byte(`{"format_version":"2.0"}`), planner.TextOptions{}); err == nil {
		t.Error("a 2.x plan rendered without error")
	}
}

// TestConfigurePlanNeverCarriesTheBlob plans a Configure whose blob (with
// a token in it) is in the document's memory and checks neither the JSON
// nor the text plan contains any of it.
func TestConfigurePlanNeverCarriesTheBlob(t *testing.T) {
	ctx := context.Background()
	secret := "#!/bin/sh\nkubeadm join --token s3cr3t.abcdef0123456789 10.0.0.1:6443\n"
	for _, shape := range []hypervisors.Shape{hypervisors.ShapeLibvirt, hypervisors.ShapeProxmox} {
		t.Run(string(shape), func(t *testing.T) {
			now := func() time.Time { return t0 }
			doc, _, err := desired.Open(ctx, desired.Options{Store: desired.NewMemoryStore(nil), Installation: "inst", DeleteSupported: true, Now: now, VMName: hypervisors.VMName},
				[]desired.Slot{{ID: "m1", Zone: "a", InstanceType: "t", Capacity: desired.OnDemand, VCPU: 2, MemoryMiB: 2048}})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := doc.Mutate(ctx, desired.Request{Kind: desired.KindCreate, MachineID: "m1"}); err != nil {
				t.Fatal(err)
			}
			m := doc.Get("m1")
			if _, err := doc.Complete(ctx, "m1", m.Intent.OpID, desired.Result{Host: "a/" + m.VMName}); err != nil {
				t.Fatal(err)
			}
			if _, err := doc.Mutate(ctx, desired.Request{Kind: desired.KindConfigure, MachineID: "m1", Cluster: "c1", Blob: []byte(secret),
				Metadata: map[string]string{"k": "v"}}); err != nil {
				t.Fatal(err)
			}
			m = doc.Get("m1")
			vm := &observed.VM{Zone: "a", Name: m.VMName, Power: observed.PowerRunning, VCPU: 2, MemoryMiB: 2048, Autostart: true,
				Marker: &observed.Marker{Installation: "inst", MachineID: "m1"}}
			snap := &observed.Snapshot{At: t0, Zones: map[string]*observed.Zone{"a": {Name: "a", Status: observed.StatusOK, At: t0, VMs: []*observed.VM{vm}}}}
			cfg := planner.Config{Shape: shape, Installation: "inst", BootstrapPath: "/run/bigfleet-bootstrap", BootstrapExec: []string{"/bin/sh"}}
			p := planner.Build(planner.Inputs{Config: cfg, Machines: doc.All(), Observed: snap, Now: t0})
			if p.Summary.Configure != 1 {
				t.Fatalf("want a Configure, got %+v", p.Summary)
			}
			js, err := planner.MarshalJSON(p)
			if err != nil {
				t.Fatal(err)
			}
			text := render(t, p, true)
			for _, needle := range []string{secret, "s3cr3t", "abcdef0123456789", "kubeadm"} {
				if bytes.Contains(js, []byte(needle)) || strings.Contains(text, needle) {
					t.Errorf("plan contains %q from the bootstrap blob", needle)
				}
			}
		})
	}
}

func TestSymbols(t *testing.T) {
	want := map[planner.Action]string{
		planner.ActionCreateOverlay: "+", planner.ActionCreateSeed: "+", planner.ActionDefine: "+", planner.ActionClone: "+",
		planner.ActionStart: ">", planner.ActionResume: ">",
		planner.ActionConfigureVM: "~", planner.ActionExecBootstrap: "~", planner.ActionBind: "~", planner.ActionWaitAgent: "~",
		planner.ActionStop: "-", planner.ActionUndefine: "-", planner.ActionDeleteVolume: "-", planner.ActionDeleteVM: "-",
	}
	for a, sym := range want {
		if a.Symbol() != sym {
			t.Errorf("%s: symbol %q, want %q", a, a.Symbol(), sym)
		}
	}
}
