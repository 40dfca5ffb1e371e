package proxmox

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/proxmoxsim"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvespec"
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
	"github.com/bigfleet-vm/provider/inventory"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/plugin"
	"github.com/bigfleet-vm/provider/plugin/plugintest"
	"github.com/google/go-cmp/cmp"
)

// resolve parses args as the plug-in's flags and resolves them.
func resolve(t *testing.T, real bool, args ...string) (*Settings, []string) {
	t.Helper()
	r, lines := plugintest.Resolve(t, Plugin(), real, "pve", args...)
	return r.(*Settings), lines
}

func TestNormaliseFingerprint(t *testing.T) {
	want := strings.Repeat("ab", 32)
	for _, in := range []string{
		want,
		strings.ToUpper(want),
		strings.TrimSuffix(strings.Repeat("AB:", 32), ":"),
		strings.TrimSuffix(strings.Repeat("ab ", 32), " "),
	} {
		got, err := normaliseFingerprint(in)
		if err != nil || got != want {
			t.Errorf("normaliseFingerprint(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", strings.Repeat("ab", 31), strings.Repeat("zz", 32), strings.Repeat("ab", 33)} {
		if _, err := normaliseFingerprint(in); err == nil {
			t.Errorf("normaliseFingerprint(%q) succeeded, want an error", in)
		}
	}
}

// TestZonesOnlyOnTheRealBackend: --nodes are the zones of the real
// backend only; the simulator's zones come from --default-zone.
func TestZonesOnlyOnTheRealBackend(t *testing.T) {
	s, probs := resolve(t, false, "--nodes", "pve1,pve2")
	if zones, fl := s.Zones(); zones != nil || fl != "nodes" || len(probs) != 0 {
		t.Errorf("simulator: zones %q (%s), problems %q", zones, fl, probs)
	}
	s, _ = resolve(t, true, "--nodes", "pve1,pve2")
	if zones, _ := s.Zones(); !cmp.Equal(zones, []string{"pve1", "pve2"}) {
		t.Errorf("real: zones %q", zones)
	}
	s, _ = resolve(t, true, "--nodes", "pve1,pve1")
	if zones, _ := s.Zones(); zones != nil {
		t.Errorf("real with a bad --nodes: zones %q, want none", zones)
	}
}

// TestCatalogRules: an entry's template_vmid is its source; 0 or none is
// --template-vmid; outside the VMID range is refused.
func TestCatalogRules(t *testing.T) {
	s, _ := resolve(t, false, "--template-vmid", "9001")
	r := s.Catalog()
	for _, tt := range []struct {
		in      *int
		want    int
		wantErr string
	}{
		{nil, 9001, ""},
		{ptr(0), 9001, ""},
		{ptr(9100), 9100, ""},
		{ptr(99), 0, "template_vmid: template VMID 99 is outside the Proxmox VMID range 100..999999999"},
	} {
		got, err := r.Source(tt.in)
		if tt.wantErr != "" {
			if err == nil || err.Error() != tt.wantErr {
				t.Errorf("Source(%v) = %v, %v; want %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("Source(%v) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	if c := inventory.Builtin(r); c["pve.small"].Source != 9001 || len(c) != 4 {
		t.Errorf("built-in catalog %+v", c)
	}
	if _, err := inventory.ParseCapacityType("bare_metal", s.CapacityRules()); err == nil || !strings.Contains(err.Error(), "not supported on Proxmox") {
		t.Errorf("bare_metal on Proxmox: %v", err)
	}
}

func ptr(n int) *int { return &n }

// TestSettingsNeverPrintTheSecret: however the resolved settings are
// printed or logged, the token secret is not in the output.
func TestSettingsNeverPrintTheSecret(t *testing.T) {
	const secret = "0f9e8d7c-SECRET"
	s, _ := resolve(t, false, "--proxmox-token-secret", secret, "--proxmox-token-id", "a@pve!b")
	if s.TokenSecret.Reveal() != secret {
		t.Fatalf("secret %q", s.TokenSecret.Reveal())
	}
	var out []string
	var r plugin.Resolved = s
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x"} {
		out = append(out, fmt.Sprintf(verb, s), fmt.Sprintf(verb, *s), fmt.Sprintf(verb, r), fmt.Sprintf(verb, struct{ R plugin.Resolved }{r}))
	}
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "settings", s, "resolved", r)
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("x", "settings", s, "resolved", r)
	out = append(out, buf.String())
	for _, o := range out {
		if strings.Contains(o, secret) || strings.Contains(o, fmt.Sprintf("%x", secret)) {
			t.Errorf("output shows the secret: %s", o)
		}
	}
}

// TestSimulatorHasTheCapability: the simulator the plug-in opens is
// driven by the /admin/ endpoints through the Simulator capability, and
// its guest answers the readiness probe the core plans for it.
func TestSimulatorHasTheCapability(t *testing.T) {
	s, _ := resolve(t, false)
	hv, err := s.OpenSimulator(plugin.SimOptions{Zones: []string{"pve-a", "pve-b"}})
	if err != nil {
		t.Fatal(err)
	}
	defer hv.Close()
	sim := hypervisors.CapabilitiesOf(hv).Simulator
	if sim == nil {
		t.Fatal("the simulator has no Simulator capability")
	}
	if err := sim.AddForeign(hypervisors.Target{Zone: "pve-a", Name: "other"}); err != nil {
		t.Fatal(err)
	}
	if simcore.DefaultReadyCommand != plugin.SimReadyCommand {
		t.Errorf("the simulated guest answers %q, the core plans %q", simcore.DefaultReadyCommand, plugin.SimReadyCommand)
	}
}

// TestSimulatorUsesTheFlags: the simulator the plug-in opens holds the
// --template-vmid template and every other template the catalog names, on
// the first zone, and answers the bootstrap at --bootstrap-path.
func TestSimulatorUsesTheFlags(t *testing.T) {
	ctx := context.Background()
	s, probs := resolve(t, false, "--template-vmid", "7000", "--bootstrap-path", "/run/other-bootstrap")
	if len(probs) != 0 {
		t.Fatalf("problems %q", probs)
	}
	catalog := inventory.Catalog{
		"a": {Name: "a", VCPU: 2, MemoryMiB: 2048, Source: 7000},
		"b": {Name: "b", VCPU: 4, MemoryMiB: 4096, Source: 7001},
	}
	hv, err := s.OpenSimulator(plugin.SimOptions{Zones: []string{"pve-a", "pve-b"}, Catalog: catalog})
	if err != nil {
		t.Fatal(err)
	}
	defer hv.Close()
	z, err := hv.Observe(ctx, "pve-a")
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, vm := range z.VMs {
		if vm.Template {
			got = append(got, vm.VMID)
		}
	}
	if want := []int{7000, 7001}; !cmp.Equal(want, got) {
		t.Errorf("templates on pve-a %v, want %v", got, want)
	}
	sim := hv.(*proxmoxsim.Proxmox)
	m := observed.Marker{Installation: "inst", MachineID: "m-1", Cluster: "c-1"}
	id, err := sim.CloneVM(ctx, "pve-a", pvespec.CloneSpec{Name: "bf-inst-m-1", TemplateVMID: 7001, Marker: m})
	if err != nil {
		t.Fatal(err)
	}
	vm := hypervisors.Target{Zone: "pve-a", Name: "bf-inst-m-1", VMID: id}
	if err := sim.Start(ctx, vm); err != nil {
		t.Fatal(err)
	}
	if err := sim.AgentWriteFile(ctx, vm, "/run/other-bootstrap", []byte("blob"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := sim.AgentExec(ctx, vm, []string{"/bin/sh", "/run/other-bootstrap"})
	if err != nil || r.ExitCode != 0 || len(sim.Bootstraps(vm)) != 1 {
		t.Errorf("bootstrap at --bootstrap-path: exit %d %q, %v, bootstraps %v", r.ExitCode, r.Stderr, err, sim.Bootstraps(vm))
	}
}
