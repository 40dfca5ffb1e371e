package golden

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/libvirtsim"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/proxmoxsim"
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/planner"
)

var update = flag.Bool("update", false, "rewrite the expected plan.txt and plan.json sections of golden/testdata/*.txtar")

// TestGolden runs the libvirt and Proxmox cases of testdata/ on their
// simulators.
func TestGolden(t *testing.T) {
	Run(t, "testdata", *update, 40, libvirtSetup, proxmoxSetup)
}

// keys checks a case's plug-in planner keys against those allowed.
func keys(got map[string]string, allowed ...string) error {
	var bad []string
	for k := range got {
		if !strings.Contains(" "+strings.Join(allowed, " ")+" ", " "+k+" ") {
			bad = append(bad, k)
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return fmt.Errorf("unknown key(s) %s (this hypervisor's: %s)", strings.Join(bad, ", "), strings.Join(allowed, ", "))
	}
	return nil
}

var libvirtSetup = Setup{
	Name: "libvirt", Zones: []string{"host-a", "host-b"}, Type: "kvm.small",
	Planner: func(k map[string]string) (planner.Plugin, error) {
		if err := keys(k, "user_data", "kernel"); err != nil {
			return nil, err
		}
		return libvirt.Planner(libvirt.PlanSettings{Pool: libvirtsim.DefaultPool, Image: libvirtsim.DefaultImage, Network: libvirtsim.DefaultNetwork,
			DomainType: "kvm", UserData: k["user_data"], Kernel: k["kernel"]}), nil
	},
	World: func(zones []string, now func() time.Time) World {
		return lvWorld{libvirtsim.NewLibvirt(libvirtsim.Options{Options: simcore.Options{Zones: zones, Clock: now}})}
	},
}

var proxmoxSetup = Setup{
	Name: "proxmox", Zones: []string{"pve-a", "pve-b"}, Type: "pve.small", SourceID: proxmoxsim.DefaultTemplateVMID,
	Planner: func(k map[string]string) (planner.Plugin, error) {
		if err := keys(k, "proxmox_pool"); err != nil {
			return nil, err
		}
		return proxmox.Planner(proxmox.PlanSettings{Pool: k["proxmox_pool"], BootstrapPath: simcore.DefaultBootstrapPath,
			BootstrapExec: []string{"/bin/sh"}}), nil
	},
	World: func(zones []string, now func() time.Time) World {
		return pveWorld{proxmoxsim.NewProxmox(proxmoxsim.Options{Options: simcore.Options{Zones: zones, Clock: now}})}
	},
}

type outOfBand interface {
	StopVM(hypervisors.Target) error
	PauseVM(hypervisors.Target) error
	CrashVM(hypervisors.Target) error
}

func setPower(s outOfBand, t hypervisors.Target, p observed.Power) error {
	switch p {
	case observed.PowerRunning:
		return nil
	case observed.PowerStopped:
		return s.StopVM(t)
	case observed.PowerPaused:
		return s.PauseVM(t)
	case observed.PowerCrashed:
		return s.CrashVM(t)
	}
	return fmt.Errorf("power %q", p)
}

type lvWorld struct{ *libvirtsim.Libvirt }

func (w lvWorld) AddVM(zone, name string, _ int, mk *observed.Marker, owned bool, power observed.Power) (hypervisors.Target, error) {
	t := hypervisors.Target{Zone: zone, Name: name}
	if owned {
		return t, w.AddOwnedVM(zone, name, *mk, power)
	}
	if err := w.AddForeignVM(zone, name, mk); err != nil {
		return t, err
	}
	return t, setPower(w, t, power)
}

// AddFixture adds a volume: an overlay "<vm>-disk.qcow2", or a seed
// "<vm>-cidata.iso" holding the seed its machine needs, unless followed by
// " blank" (created, never uploaded) or " stale" (built from other inputs).
func (w lvWorld) AddFixture(zone, line string, fx Fixture) error {
	ctx := context.Background()
	name, how, _ := strings.Cut(line, " ")
	switch {
	case strings.HasSuffix(name, "-disk.qcow2"):
		return w.CreateOverlay(ctx, zone, lvspec.OverlaySpec{Pool: libvirtsim.DefaultPool, Name: name, BaseImage: libvirtsim.DefaultImage})
	case strings.HasSuffix(name, "-cidata.iso") && how == "blank":
		return w.AddBlankSeedVolume(zone, libvirtsim.DefaultPool, name)
	case strings.HasSuffix(name, "-cidata.iso") && (how == "" || how == "stale"):
		spec := lvspec.SeedSpec{Pool: libvirtsim.DefaultPool, Name: name, InstanceID: name, Hostname: name}
		for vm, id := range fx.Machines {
			if lvspec.SeedVolume(vm) == name && how == "" {
				spec.InstanceID, spec.Hostname, spec.UserData = id, vm, fx.Keys["user_data"]
			}
		}
		return w.CreateSeed(ctx, zone, spec)
	}
	return errors.New(`a volume name ends in -disk.qcow2 or -cidata.iso (a seed optionally followed by " blank" or " stale")`)
}

type pveWorld struct{ *proxmoxsim.Proxmox }

func (w pveWorld) AddVM(zone, name string, vmid int, mk *observed.Marker, owned bool, power observed.Power) (hypervisors.Target, error) {
	t := hypervisors.Target{Zone: zone, Name: name}
	var err error
	if owned {
		t.VMID, err = w.AddOwnedVM(zone, name, *mk, power)
		if err == nil && vmid != 0 && t.VMID != vmid {
			err = fmt.Errorf("the simulator allocated VMID %d for %s, observed.yaml says %d (owned VMs take the lowest free VMID in file order)", t.VMID, name, vmid)
		}
		return t, err
	}
	if t.VMID, err = w.AddForeignVM(zone, vmid, name, mk); err != nil {
		return t, err
	}
	return t, setPower(w, t, power)
}

func (pveWorld) AddFixture(string, string, Fixture) error {
	return fmt.Errorf("volumes exist on libvirt only: %w", hypervisors.ErrUnsupported)
}
