package libvirt

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/libvirtsim"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
	"github.com/bigfleet-vm/provider/inventory"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/plugin"
	"github.com/bigfleet-vm/provider/plugin/plugintest"
	"github.com/google/go-cmp/cmp"
)

// resolve parses args as the plug-in's flags and resolves them.
func resolve(t *testing.T, real bool, args ...string) (*Settings, []string) {
	t.Helper()
	r, lines := plugintest.Resolve(t, Plugin(), real, "local", args...)
	return r.(*Settings), lines
}

// TestCerts: the real backend presents the client certificate of each
// qemu+tls:// zone found in its pkipath, once per file; other transports
// and the simulator present none.
func TestCerts(t *testing.T) {
	pki := t.TempDir()
	for _, f := range []string{"clientcert.pem", "clientkey.pem"} {
		if err := os.WriteFile(filepath.Join(pki, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	connect := "a=qemu+tls://h1/system?pkipath=" + pki + ",b=qemu+tls://h2/system?pkipath=" + pki + ",c=qemu+libssh://u@h3/system?keyfile=/k&known_hosts=/kh"
	s, probs := resolve(t, true, "--connect", connect, "--image", "base.qcow2")
	if len(probs) != 0 {
		t.Fatalf("problems %q", probs)
	}
	want := []plugin.CertFile{{Flag: "connect", Role: CertClientRole, Cert: filepath.Join(pki, "clientcert.pem"), Key: filepath.Join(pki, "clientkey.pem"),
		Context: `zone "a"`, Noun: "libvirt TLS client"}}
	if diff := cmp.Diff(want, s.Certs()); diff != "" {
		t.Errorf("Certs (-want +got):\n%s", diff)
	}
	if zones, fl := s.Zones(); !cmp.Equal(zones, []string{"a", "b", "c"}) || fl != "connect" {
		t.Errorf("zones %q (%s)", zones, fl)
	}
	s, _ = resolve(t, false, "--connect", connect)
	if got := s.Certs(); got != nil {
		t.Errorf("the simulator presents %+v", got)
	}
}

// TestCatalogRules: kvm.* types boot from --image; a template_vmid key
// is refused with the wording config's tests expect.
func TestCatalogRules(t *testing.T) {
	s, _ := resolve(t, false)
	r := s.Catalog()
	if got, err := r.Source(nil); got != 0 || err != nil {
		t.Errorf("Source(nil) = %v, %v", got, err)
	}
	n := 9000
	if _, err := r.Source(&n); err == nil || err.Error() != "template_vmid is a Proxmox setting; libvirt types boot from --image, remove the key" {
		t.Errorf("Source(9000) error %v", err)
	}
	if c := inventory.Builtin(r); c["kvm.small"].Source != 0 || len(c) != 4 {
		t.Errorf("built-in catalog %+v", c)
	}
	if ct, err := inventory.ParseCapacityType("metal", s.CapacityRules()); ct != inventory.BareMetal || err != nil {
		t.Errorf("metal on libvirt: %q, %v", ct, err)
	}
}

// TestPlannerImage: on the simulator an empty --image plans the
// simulator's golden image; the real backend requires --image.
func TestPlannerImage(t *testing.T) {
	s, _ := resolve(t, false)
	if got := s.Planner(plugin.PlannerOptions{Simulated: true}).(*plan).s.Image; got != libvirtsim.DefaultImage {
		t.Errorf("simulated image %q, want %q", got, libvirtsim.DefaultImage)
	}
	s, probs := resolve(t, true, "--connect", "qemu:///system")
	if got := s.Planner(plugin.PlannerOptions{}).(*plan).s.Image; got != "" {
		t.Errorf("real image %q", got)
	}
	if len(probs) != 1 || !strings.HasPrefix(probs[0], "--image: is required by the libvirt backend") {
		t.Errorf("problems %q", probs)
	}
}

// TestSimulatorHasTheCapability: the libvirt simulator is driven through
// the Simulator capability.
func TestSimulatorHasTheCapability(t *testing.T) {
	s, _ := resolve(t, false)
	hv, err := s.OpenSimulator(plugin.SimOptions{Zones: []string{"local-a"}})
	if err != nil {
		t.Fatal(err)
	}
	defer hv.Close()
	sim := hypervisors.CapabilitiesOf(hv).Simulator
	if sim == nil {
		t.Fatal("the simulator has no Simulator capability")
	}
	if err := sim.AddForeign(hypervisors.Target{Zone: "local-a", Name: "other"}); err != nil {
		t.Fatal(err)
	}
}

// TestSimulatorUsesTheFlags: the simulator the plug-in opens holds the
// base image --image names in the --storage-pool pool and the --network
// network, so a domain planned from the flags starts on it.
func TestSimulatorUsesTheFlags(t *testing.T) {
	ctx := context.Background()
	s, probs := resolve(t, false, "--storage-pool", "vms", "--network", "br0", "--image", "base.qcow2")
	if len(probs) != 0 {
		t.Fatalf("problems %q", probs)
	}
	hv, err := s.OpenSimulator(plugin.SimOptions{Zones: []string{"local-a"}})
	if err != nil {
		t.Fatal(err)
	}
	defer hv.Close()
	sim := hv.(*libvirtsim.Libvirt)
	want := []libvirtsim.Volume{{Pool: "vms", Name: "base.qcow2", Format: libvirtsim.DefaultImageFormat, CapacityGiB: libvirtsim.DefaultImageSizeGiB}}
	if d := cmp.Diff(want, sim.Volumes("local-a")); d != "" {
		t.Fatalf("volumes (-want +got):\n%s", d)
	}
	m := observed.Marker{Installation: "inst", MachineID: "m-1"}
	name := "bf-inst-m-1"
	spec := lvspec.DomainSpec{Name: name, VCPU: 2, MemoryMiB: 2048, DomainType: "kvm", Pool: "vms",
		Overlay: lvspec.OverlayVolume(name), Seed: lvspec.SeedVolume(name), Network: "br0", Marker: m}
	steps := []func() error{
		func() error {
			return sim.CreateOverlay(ctx, "local-a", lvspec.OverlaySpec{Pool: "vms", Name: spec.Overlay, BaseImage: "base.qcow2"})
		},
		func() error {
			return sim.CreateSeed(ctx, "local-a", lvspec.SeedSpec{Pool: "vms", Name: spec.Seed, InstanceID: name, Hostname: name})
		},
		func() error { return sim.DefineDomain(ctx, "local-a", spec) },
		func() error { return sim.Start(ctx, hypervisors.Target{Zone: "local-a", Name: name}) },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
}
