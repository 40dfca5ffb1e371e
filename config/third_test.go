package config

import (
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox"
	"github.com/bigfleet-vm/provider/inventory"
	"github.com/bigfleet-vm/provider/planner"
	"github.com/bigfleet-vm/provider/plugin"
	"github.com/google/go-cmp/cmp"
)

// third is a minimal third hypervisor: config resolves it with no edit.
type third struct{}

func (third) Info() plugin.Info {
	return plugin.Info{Name: "third", Title: "Third", FlagGroup: "Third parameters", DefaultZone: "t", CreateTimeout: 3 * time.Minute,
		Backend: plugin.Backend{Flag: "third-backend", Real: "third", ConnFlag: "third-url", RealNoun: "third host", RealNouns: "third hosts"}}
}

type thirdFlags struct{ backend, url *string }

func (third) RegisterFlags(fs *flag.FlagSet) plugin.Flags {
	return thirdFlags{fs.String("third-backend", "auto", "third, fake or auto."), fs.String("third-url", "", "The third host.")}
}

func (thirdFlags) Names() []string                         { return []string{"third-backend", "third-url"} }
func (f thirdFlags) Usage() []string                       { return f.Names() }
func (thirdFlags) Bounds() plugin.Bounds                   { return plugin.Bounds{} }
func (f thirdFlags) Backend() (string, bool)               { return *f.backend, *f.url != "" }
func (thirdFlags) ReportsDefaultZone(map[string]bool) bool { return false }
func (f thirdFlags) Resolve(env plugin.Env, p plugin.Problems) plugin.Resolved {
	r := thirdResolved{}
	if env.Real {
		r.zones = []string{"t1"}
	}
	return r
}

type thirdResolved struct{ zones []string }

func (r thirdResolved) Zones() ([]string, string)      { return r.zones, "third-url" }
func (thirdResolved) Capacity() inventory.CapacityType { return inventory.OnDemand }
func (thirdResolved) Catalog() inventory.CatalogRules {
	return inventory.CatalogRules{Prefix: "t.", Keys: "vcpu, memory_mib"}
}
func (thirdResolved) CapacityRules() inventory.CapacityRules {
	return inventory.CapacityRules{Where: "a third host"}
}
func (thirdResolved) Certs() []plugin.CertFile { return nil }
func (thirdResolved) Summary() (string, []slog.Attr) {
	return " url=x", []slog.Attr{slog.String("url", "x")}
}
func (thirdResolved) Planner(plugin.PlannerOptions) planner.Plugin { return nil }
func (thirdResolved) Open(context.Context, plugin.OpenOptions) (hypervisors.Hypervisor, error) {
	return nil, errors.ErrUnsupported
}
func (thirdResolved) OpenSimulator(plugin.SimOptions) (hypervisors.Hypervisor, error) {
	return nil, errors.ErrUnsupported
}

// TestThirdHypervisor: config chooses, defaults and words its problems
// from the registry alone, for a hypervisor it has never heard of.
func TestThirdHypervisor(t *testing.T) {
	reg := plugin.MustRegistry(libvirt.Plugin(), proxmox.Plugin(), third{})
	c, err := Parse(reg, []string{"--third-url", "x", "--seed-count", "2"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	got := []string{c.Hypervisor, c.Backend, c.Provider, strings.Join(c.Zones, ","), c.Timeouts.Create.String(), c.Catalog.Names()[0], c.String()[strings.LastIndex(c.String(), " "):]}
	if diff := cmp.Diff([]string{"third", "third", "third", "t1", "3m0s", "t.large", " url=x"}, got); diff != "" {
		t.Errorf("resolved (-want +got):\n%s", diff)
	}
	c, err = Parse(reg, []string{"--third-backend", "fake", "--seed-count", "2"}, io.Discard)
	if err != nil || c.Backend != BackendFake || strings.Join(c.Zones, ",") != "t-a,t-b" {
		t.Errorf("fake: %+v, %v", c, err)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--hypervisor", "third", "--connect", "qemu:///system", "--third-url", "x"},
			"--hypervisor: is third, but libvirt-only flags are set (--connect); drop them or use --hypervisor=libvirt"},
		{[]string{"--connect", "qemu:///system", "--nodes", "pve1", "--third-url", "x"},
			"--hypervisor: cannot infer the hypervisor: libvirt-only flags (--connect), Proxmox-only flags (--nodes) and Third-only flags (--third-url) are all set; run one process per hypervisor and drop one side's flags, or pass --hypervisor"},
		{[]string{"--hypervisor", "xen"}, `--hypervisor: unknown hypervisor "xen"; use libvirt, proxmox or third (or omit it to infer from the flags)`},
		{[]string{"--hypervisor", "third"},
			"--third-backend: is auto but no --third-url is set, so there is no real third host to manage: pass --third-url to use real third hosts, or pass --use-fake-backend to run on the built-in simulator"},
	} {
		_, err := Parse(reg, tt.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%q) = %v, want a problem %q", tt.args, err, tt.want)
		}
	}
	var help strings.Builder
	if _, err := Parse(reg, []string{"-h"}, &help); !errors.Is(err, flag.ErrHelp) {
		t.Fatal(err)
	}
	for _, want := range []string{"libvirt, proxmox or third. Empty: inferred from the flags set (libvirt-only, Proxmox-only or Third-only flags), else libvirt.",
		"(default local, or pve for Proxmox, or t for Third)", "(default 5m for libvirt, 8m for Proxmox, 3m for Third)",
		"\nThird parameters:\n  --third-backend string\n"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("help lacks %q", want)
		}
	}
}
