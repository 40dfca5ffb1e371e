package proxmox

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvemarker"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvesim"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// TestCrashBetweenCloneAndSizing kills the provider with SIGKILL after the
// clone exists but before it was sized and tagged, restarts it on the same
// --state, and expects the SAME VM to be adopted, re-sized and re-tagged,
// with no second clone.
func TestCrashBetweenCloneAndSizing(t *testing.T) {
	for _, tc := range []struct {
		name string
		lat  func() *pvesim.Latencies
		// hold makes the crash window; crashed reports, from the VM's
		// state and the requests seen, that the provider is inside it.
		hold    func(s *pvesim.Server)
		crashed func(c *cluster, vm pvesim.VMInfo) bool
	}{{
		// The clone task finished; the sizing PUT hangs.
		name: "after-clone-before-sizing",
		lat:  pvesim.ZeroLatency,
		hold: func(s *pvesim.Server) { s.InjectDelay(pvesim.Match{Method: "PUT", Path: "/config"}, 1, time.Minute) },
		crashed: func(c *cluster, vm pvesim.VMInfo) bool {
			return vm.Lock == "" && c.sim.RequestCount(fmt.Sprintf("PUT /nodes/pve1/qemu/%d/config", vm.VMID)) > 0
		},
	}, {
		// The clone task is still running (the VM exists, locked "clone").
		name: "during-clone-task",
		lat: func() *pvesim.Latencies {
			l := pvesim.ZeroLatency()
			l.Task[pvesim.KindClone] = 1500 * time.Millisecond
			return l
		},
		hold:    func(*pvesim.Server) {},
		crashed: func(_ *cluster, vm pvesim.VMInfo) bool { return vm.Lock == "clone" },
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, clusterOpts{latencies: tc.lat(), setup: tc.hold})
			p := c.start(t, launch{})
			id := p.machines("pve1")[0]
			p.create(id)
			var vm pvesim.VMInfo
			eventually(t, "the provider to be between clone and sizing", func() bool {
				ids := c.clones()
				if len(ids) == 0 {
					return false
				}
				vm, _ = c.sim.VM(ids[0])
				return tc.crashed(c, vm)
			})
			p.Kill()
			// The crash window really was before sizing and tagging.
			vm, _ = c.sim.VM(vm.VMID)
			if vm.Cores != 1 || vm.MemoryMiB != 1024 || vm.Tags != "golden" || vm.OnBoot {
				t.Fatalf("vm %d at the crash: %d cores, %d MiB, tags %q, onboot %v; want the template's 1, 1024, golden, false",
					vm.VMID, vm.Cores, vm.MemoryMiB, vm.Tags, vm.OnBoot)
			}
			c.sim.ClearFaults()

			p.Restart()
			m := p.wait(id, providertest.StIdle)
			if got := vmidOf(t, m); got != vm.VMID {
				t.Errorf("IDLE on vm %d, want the crashed clone %d adopted", got, vm.VMID)
			}
			if got := c.clones(); !slices.Equal(got, []int{vm.VMID}) {
				t.Errorf("clones after restart = %v, want only [%d]", got, vm.VMID)
			}
			if n := c.sim.RequestCount(cloneEndpoint); n != 1 {
				t.Errorf("%d clone requests, want 1 (adoption, not a second clone)", n)
			}
			after, _ := c.sim.VM(vm.VMID)
			tags := strings.Split(after.Tags, ";")
			mk := pvemarker.ParseDescription(after.Description)
			if after.Cores != 2 || after.MemoryMiB != 4096 || !after.OnBoot || after.Status != "running" ||
				mk == nil || mk.MachineID != id || !pvemarker.HasOwnershipTags(tags, mk.Installation) || slices.Contains(tags, "golden") {
				t.Errorf("adopted vm %d: %+v; want 2 cores, 4096 MiB, onboot, running, ownership tags only, marker of %s", vm.VMID, after, id)
			}
		})
	}
}

// TestVMDeletedOutOfBand: an IDLE machine's VM is removed behind the
// provider's back; the next reconcile tick marks the machine FAILED with a
// last_error that says the VM vanished, and nothing is recreated.
func TestVMDeletedOutOfBand(t *testing.T) {
	t.Parallel()
	c := newCluster(t, clusterOpts{})
	p := c.start(t, launch{})
	id := p.machines("pve2")[0]
	vmid := p.toIdle(id)
	if !c.sim.RemoveVM(vmid) {
		t.Fatalf("vm %d did not exist", vmid)
	}
	m := p.waitFailed(id)
	ref := fmt.Sprintf("pve2/%d", vmid)
	for _, want := range []string{"vanished", ref} {
		if !strings.Contains(m.LastError, want) {
			t.Errorf("last_error %q does not mention %q", m.LastError, want)
		}
	}
	time.Sleep(1500 * time.Millisecond) // a reconcile tick more
	if got := c.clones(); len(got) != 0 {
		t.Errorf("VMs after drift = %v, want none (no silent recreation)", got)
	}
	t.Logf("last_error: %s", m.LastError)
}
