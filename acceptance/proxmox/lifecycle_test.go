package proxmox

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/hypervisors/guest"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvemarker"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

const bootstrapPath = "/run/bigfleet-acc/bootstrap.blob"

// TestLifecycle walks one machine on pve2 (the template lives on pve1)
// through Create, Configure, Drain and Delete, once per way of trusting
// the API certificate.
func TestLifecycle(t *testing.T) {
	for _, tr := range []trust{pinFingerprint, caFile} {
		t.Run(tr.String(), func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, clusterOpts{})
			p := c.start(t, launch{trust: tr, args: []string{
				"--bootstrap-path", bootstrapPath, "--bootstrap-exec", "/bin/sh"}})
			id := p.machines("pve2")[0]

			// Create.
			p.create(id)
			m := p.wait(id, providertest.StIdle)
			vmid := vmidOf(t, m)
			if m.Host.GetProvider() != "proxmox" {
				t.Errorf("host provider = %q, want proxmox", m.Host.GetProvider())
			}
			vm, ok := c.sim.VM(vmid)
			if !ok {
				t.Fatalf("vm %d of host ref %q does not exist", vmid, m.Host.Ref)
			}
			mk := pvemarker.ParseDescription(vm.Description)
			if mk == nil {
				t.Fatalf("vm %d description %q carries no marker", vmid, vm.Description)
			}
			type facts struct {
				Node, Status, Pool string
				Cores, MemoryMiB   int
				OnBoot, Template   bool
				Lock, Machine      string
			}
			want := facts{Node: "pve2", Status: "running", Pool: poolName, Cores: 2, MemoryMiB: 4096, OnBoot: true, Machine: id}
			got := facts{Node: vm.Node, Status: vm.Status, Pool: vm.Pool, Cores: vm.Cores, MemoryMiB: vm.MemoryMiB,
				OnBoot: vm.OnBoot, Template: vm.Template, Lock: vm.Lock, Machine: mk.MachineID}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("vm %d after Create (-want +got):\n%s", vmid, diff)
			}
			tags := strings.Split(vm.Tags, ";")
			if !pvemarker.HasOwnershipTags(tags, mk.Installation) || !slices.Contains(tags, pvemarker.MachineTag(id)) {
				t.Errorf("vm %d tags %q lack the ownership or machine tag", vmid, vm.Tags)
			}
			if slices.Contains(tags, "golden") {
				t.Errorf("vm %d kept the template's tags: %q", vmid, vm.Tags)
			}
			if got := c.clones(); !slices.Equal(got, []int{vmid}) {
				t.Errorf("clones after Create = %v, want [%d]", got, vmid)
			}

			// Configure.
			blob := []byte("#!/bin/sh\n# acceptance bootstrap\necho joining\n")
			p.configure(id, "cluster-a", blob)
			if m := p.wait(id, providertest.StConfigured); m.Cluster != "cluster-a" {
				t.Errorf("cluster = %q, want cluster-a", m.Cluster)
			}
			g := c.guest(vmid)
			// The blob is written once, staged (under guest.StageDir, as a
			// private part renamed into place); the guest-op wrapper moves
			// it to the hook's path right before the hook and removes it.
			var blobWrites []string
			for _, w := range g.Writes() {
				if bytes.Equal(w.data, blob) {
					blobWrites = append(blobWrites, w.path)
				}
			}
			if len(blobWrites) != 1 || !strings.HasPrefix(blobWrites[0], guest.StageDir+"/") {
				t.Errorf("blob writes at %v, want one, staged under %s", blobWrites, guest.StageDir)
			}
			for _, f := range g.Files() {
				if f == bootstrapPath || strings.HasPrefix(f, guest.StageDir+"/") {
					t.Errorf("blob still at %s after Configure", f)
				}
			}
			hook := []string{"/bin/sh", bootstrapPath}
			execs := g.Execs()
			ih, ir := slices.IndexFunc(execs, func(a []string) bool { return slices.Equal(a, hook) }),
				slices.IndexFunc(execs, func(a []string) bool {
					return len(a) > 2 && a[2] == guest.UnstageScript && slices.Contains(a, bootstrapPath)
				})
			if ih < 0 || ir < ih {
				t.Errorf("guest execs = %q; want the hook %q, then the blob removed", execs, hook)
			}
			if vm, _ := c.sim.VM(vmid); pvemarker.ParseDescription(vm.Description).Cluster != "cluster-a" {
				t.Errorf("description marker after Configure = %q, want cluster-a bound", vm.Description)
			}

			// Drain.
			p.drain(id, 30)
			p.wait(id, providertest.StIdle)
			var drain []string
			for _, a := range g.Execs() {
				if len(a) == 3 && a[0] == "/bin/sh" && a[1] == "-c" && strings.Contains(a[2], "kubectl drain") {
					drain = a
				}
			}
			if drain == nil {
				t.Fatalf("no kubectl drain among the guest execs %q", g.Execs())
			}
			for _, want := range []string{"--grace-period=30", "kubectl cordon"} {
				if !strings.Contains(drain[2], want) {
					t.Errorf("drain script lacks %q:\n%s", want, drain[2])
				}
			}
			if strings.Contains(drain[2], "|| true") {
				t.Errorf("drain script swallows failures:\n%s", drain[2])
			}

			// Delete.
			p.delete(id)
			if m := p.wait(id, providertest.StSpeculative); m.Host != nil {
				t.Errorf("host after Delete = %v, want none", m.Host)
			}
			if _, ok := c.sim.VM(vmid); ok {
				t.Errorf("vm %d still exists after Delete", vmid)
			}
			if got := c.clones(); len(got) != 0 {
				t.Errorf("clones after Delete = %v, want none", got)
			}
			t.Logf("vm %d: %d API requests over the lifecycle; guest execs %q", vmid, c.sim.RequestCount(""), g.Execs())
		})
	}
}
