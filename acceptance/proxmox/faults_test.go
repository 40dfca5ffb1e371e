package proxmox

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/hypervisors/guest"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvemarker"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvesim"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

const cloneEndpoint = "POST /nodes/pve1/qemu/9000/clone"

// waitFailed polls Get until the machine is FAILED; reaching one of the
// wrong states is fatal.
func (p *provider) waitFailed(id string, wrong ...pb.MachineState) *pb.Machine {
	p.t.Helper()
	var m *pb.Machine
	for deadline := time.Now().Add(pollTimeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		m = p.get(id)
		if m.State == providertest.StFailed {
			return m
		}
		if slices.Contains(wrong, m.State) {
			p.t.Fatalf("machine %s reached %v, want FAILED", id, m.State)
		}
	}
	p.t.Fatalf("machine %s still %v after %v, want FAILED", id, m.GetState(), pollTimeout)
	return nil
}

// TestConcurrentCreatesCollidingNextID runs 20 Creates at once on one node
// while /cluster/nextid answers the same id to everyone, and the first
// five ids from it are taken by VMs outside the token's pool (invisible in
// its /cluster/resources listing, as on a shared cluster), so clones
// really collide with "already exists".
func TestConcurrentCreatesCollidingNextID(t *testing.T) {
	t.Parallel()
	const n, foreign = 20, 5
	// A least-privilege token scoped to the pool: foreign VMs are invisible.
	acl := map[string][]string{
		"/":                 {"Sys.Audit"},
		"/vms/9000":         {"VM.Clone", "VM.Audit"},
		"/pool/" + poolName: {"VM.Allocate", "VM.Audit", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Options", "VM.PowerMgmt", "VM.Monitor"},
		"/storage":          {"Datastore.AllocateSpace"},
		"/nodes":            {"Sys.Audit"},
	}
	c := newCluster(t, clusterOpts{acl: acl, setup: func(s *pvesim.Server) {
		for i := range foreign {
			if err := s.AddVM(pvesim.VMSpec{VMID: 100 + i, Node: "pve1", Name: fmt.Sprintf("someone-else-%d", i), Running: true}); err != nil {
				t.Fatal(err)
			}
		}
		s.FixNextID(100)
	}})
	p := c.start(t, launch{offerings: []offering{{"pve.small", "pve1", "on_demand", n}}})
	ids := p.machines("pve1")
	if len(ids) != n {
		t.Fatalf("have %d machines on pve1, want %d", len(ids), n)
	}
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := p.api.Create(rpcCtx(t), &pb.CreateRequest{MachineId: id}); err != nil {
				t.Errorf("Create %s: %v", id, err)
			}
		}()
	}
	wg.Wait()
	seen := map[int]string{}
	for _, id := range ids {
		vmid := vmidOf(t, p.wait(id, providertest.StIdle))
		if other, dup := seen[vmid]; dup {
			t.Errorf("machines %s and %s share vm %d", other, id, vmid)
		}
		seen[vmid] = id
		vm, _ := c.sim.VM(vmid)
		if mk := pvemarker.ParseDescription(vm.Description); mk == nil || mk.MachineID != id {
			t.Errorf("vm %d of machine %s carries marker %+v", vmid, id, mk)
		}
		if vm.Cores != 2 || vm.MemoryMiB != 4096 || vm.Status != "running" {
			t.Errorf("vm %d: %d cores, %d MiB, %s; want 2, 4096, running", vmid, vm.Cores, vm.MemoryMiB, vm.Status)
		}
	}
	if got := len(c.clones()); got != n+foreign {
		t.Errorf("%d VMs besides the template, want %d ours + %d foreign (no duplicates)", got, n, foreign)
	}
	for i := range foreign {
		if vm, ok := c.sim.VM(100 + i); !ok || !strings.HasPrefix(vm.Name, "someone-else-") {
			t.Errorf("foreign vm %d was replaced or removed: %+v", 100+i, vm)
		}
	}
	t.Logf("%d clone requests for %d machines (%d collisions), %d nextid requests", c.sim.RequestCount(cloneEndpoint), n,
		c.sim.RequestCount(cloneEndpoint)-n, c.sim.RequestCount("GET /cluster/nextid"))
}

// TestFailedCloneTask: a clone task that ends with a non-OK exit status is
// not success (go-proxmox's wait would say it is). The adapter classifies
// it transient, so the executor retries within the Create deadline: one
// failed task converges to IDLE with exactly one VM, and a clone that
// always fails ends FAILED at the deadline with the task's exit status in
// last_error and no VM left behind.
func TestFailedCloneTask(t *testing.T) {
	const exit = "clone failed: storage 'local-lvm' is full"
	t.Run("once", func(t *testing.T) {
		t.Parallel()
		c := newCluster(t, clusterOpts{setup: func(s *pvesim.Server) { s.FailTasks(pvesim.KindClone, 1, exit) }})
		p := c.start(t, launch{})
		id := p.machines("pve1")[0]
		vmid := p.toIdle(id)
		if got := c.clones(); !slices.Equal(got, []int{vmid}) {
			t.Errorf("clones = %v, want only [%d]", got, vmid)
		}
		if got := c.sim.RequestCount(cloneEndpoint); got != 2 {
			t.Errorf("%d clone requests, want 2 (the failed task, then the retry)", got)
		}
	})
	t.Run("always", func(t *testing.T) {
		t.Parallel()
		c := newCluster(t, clusterOpts{setup: func(s *pvesim.Server) { s.FailTasks(pvesim.KindClone, -1, exit) }})
		p := c.start(t, launch{args: []string{"--create-timeout", "3s"}})
		id := p.machines("pve1")[0]
		p.create(id)
		m := p.waitFailed(id, providertest.StIdle)
		for _, want := range []string{"timed out", exit} {
			if !strings.Contains(m.LastError, want) {
				t.Errorf("last_error %q does not mention %q", m.LastError, want)
			}
		}
		if got := c.clones(); len(got) != 0 {
			t.Errorf("failed clones left VMs behind: %v", got)
		}
		if n := c.sim.RequestCount(cloneEndpoint); n < 2 {
			t.Errorf("%d clone requests; a failed task is transient and should be retried", n)
		}
	})
}

// TestLockErrorsThenSuccess: "can't lock file" twice, then success.
func TestLockErrorsThenSuccess(t *testing.T) {
	for _, tc := range []struct {
		name  string
		match pvesim.Match
		key   string // request key prefix counted
	}{
		{"clone", pvesim.Match{Method: "POST", Path: "/qemu/9000/clone"}, cloneEndpoint},
		{"config", pvesim.Match{Method: "PUT", Path: "/config"}, "PUT /nodes/pve1/qemu/"},
		{"start", pvesim.Match{Method: "POST", Path: "/status/start"}, "/status/start"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, clusterOpts{setup: func(s *pvesim.Server) { s.InjectLockErrors(tc.match, 2) }})
			p := c.start(t, launch{})
			id := p.machines("pve1")[0]
			vmid := p.toIdle(id)
			if got := c.clones(); !slices.Equal(got, []int{vmid}) {
				t.Errorf("clones = %v, want only [%d]", got, vmid)
			}
			if got := c.sim.RequestCount(tc.key); got != 3 {
				t.Errorf("%d %q requests, want 3 (two lock errors, one success)", got, tc.key)
			}
		})
	}
}

// TestForbiddenIsTerminal: a 403 fails the machine at once; the request is
// never retried.
func TestForbiddenIsTerminal(t *testing.T) {
	for _, tc := range []struct {
		name   string
		inject func(c *cluster)
		key    string
		want   []string
	}{{
		name: "clone-403",
		inject: func(c *cluster) {
			c.sim.InjectForbidden(pvesim.Match{Method: "POST", Path: "/clone"}, -1, "/vms/9000", "VM.Clone")
		},
		key:  cloneEndpoint,
		want: []string{"403", "VM.Clone"},
	}, {
		name: "revoked-config-memory",
		inject: func(c *cluster) {
			c.sim.Revoke(tokenID, "/", "VM.Config.Memory")
		},
		key:  "PUT /nodes/pve1/qemu/",
		want: []string{"403", "VM.Config.Memory"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, clusterOpts{})
			p := c.start(t, launch{}) // preflight passes; the privilege goes afterwards
			tc.inject(c)
			id := p.machines("pve1")[0]
			began := time.Now()
			p.create(id)
			m := p.waitFailed(id, providertest.StIdle)
			took := time.Since(began)
			for _, want := range tc.want {
				if !strings.Contains(m.LastError, want) {
					t.Errorf("last_error %q does not mention %q", m.LastError, want)
				}
			}
			if strings.Contains(m.LastError, "timed out") {
				t.Errorf("last_error %q: a 403 must fail at once, not at the deadline", m.LastError)
			}
			// Let the reconcile loop tick a few times: nothing may retry.
			time.Sleep(2500 * time.Millisecond)
			if got := c.sim.RequestCount(tc.key); got != 1 {
				t.Errorf("%d %q requests, want exactly 1 (403 is never retried)", got, tc.key)
			}
			t.Logf("FAILED %v after Create: %s", took.Round(time.Millisecond), m.LastError)
		})
	}
}

// TestAgentDownForAWhile: the guest agent answers "not running" for 3 s
// after boot; Create keeps waiting and reaches IDLE.
func TestAgentDownForAWhile(t *testing.T) {
	t.Parallel()
	lat := pvesim.ZeroLatency()
	lat.Task[pvesim.KindClone] = 300 * time.Millisecond // time to catch the VM before it boots
	c := newCluster(t, clusterOpts{latencies: lat})
	p := c.start(t, launch{})
	id := p.machines("pve1")[0]
	p.create(id)
	var vmid int
	eventually(t, "the clone to appear", func() bool {
		if ids := c.clones(); len(ids) > 0 {
			vmid = ids[0]
			return true
		}
		return false
	})
	const down = 3 * time.Second
	c.sim.AgentDownFor(vmid, down)
	downAt := time.Now()
	m := p.wait(id, providertest.StIdle)
	if got := vmidOf(t, m); got != vmid {
		t.Errorf("IDLE on vm %d, want %d", got, vmid)
	}
	if waited := time.Since(downAt); waited < down {
		t.Errorf("IDLE %v after the agent went down for %v", waited, down)
	}
	pings := c.sim.RequestCount(fmt.Sprintf("POST /nodes/pve1/qemu/%d/agent/ping", vmid))
	if pings < 2 {
		t.Errorf("%d agent pings; want several while the agent was down", pings)
	}
	t.Logf("agent down %v: IDLE after %v, %d agent pings", down, time.Since(downAt).Round(time.Millisecond), pings)
}

// TestHookExitsNonZero: the bootstrap hook exits 3 → FAILED with a bounded,
// blob-free last_error, and the blob is removed from the guest anyway.
func TestHookExitsNonZero(t *testing.T) {
	t.Parallel()
	c := newCluster(t, clusterOpts{})
	p := c.start(t, launch{args: []string{"--bootstrap-path", bootstrapPath}})
	id := p.machines("pve1")[0]
	vmid := p.toIdle(id)
	g := c.guest(vmid) // held: the FAILED machine's VM is reaped afterwards
	const secret = "K8S-JOIN-TOKEN-abcdef0123456789"
	blob := []byte("#!/bin/sh\nkubeadm join --token " + secret + "\n" + strings.Repeat("# padding\n", 2000) + "exit 3\n")
	p.configure(id, "cluster-a", blob)
	m := p.waitFailed(id, providertest.StConfigured)
	if !strings.Contains(m.LastError, "exited 3") {
		t.Errorf("last_error %q does not give the exit status", m.LastError)
	}
	if strings.Contains(m.LastError, secret) || strings.Contains(m.LastError, "kubeadm join") {
		t.Errorf("last_error leaks the blob: %q", m.LastError)
	}
	if len(m.LastError) > 1024 {
		t.Errorf("last_error is %d bytes, want it bounded", len(m.LastError))
	}
	if _, ok := g.File(bootstrapPath); ok {
		t.Errorf("blob still at %s after the hook failed", bootstrapPath)
	}
	if !slices.ContainsFunc(g.Execs(), func(a []string) bool {
		return len(a) > 2 && a[2] == guest.UnstageScript && slices.Contains(a, bootstrapPath)
	}) {
		t.Errorf("the blob was never removed: execs %q", g.Execs())
	}
	t.Logf("last_error: %s", m.LastError)
}

// TestDrainFails: kubectl drain exits 1 → the machine is FAILED (the
// failure is not swallowed).
func TestDrainFails(t *testing.T) {
	t.Parallel()
	c := newCluster(t, clusterOpts{})
	p := c.start(t, launch{})
	id := p.machines("pve1")[0]
	vmid := p.toIdle(id)
	p.configure(id, "cluster-a", []byte("#!/bin/sh\necho ok\n"))
	p.wait(id, providertest.StConfigured)
	const why = "error: cannot evict pod default/db-0: Cannot evict pod as it would violate the pod's disruption budget."
	c.guest(vmid).SetCommand([]string{"kubectl", "drain"}, pvesim.CommandResult{ExitCode: 1, Stderr: why + "\n"})
	p.drain(id, 10)
	m := p.waitFailed(id, providertest.StIdle)
	for _, want := range []string{"drain exited 1", "disruption budget"} {
		if !strings.Contains(m.LastError, want) {
			t.Errorf("last_error %q does not mention %q", m.LastError, want)
		}
	}
	t.Logf("last_error: %s", m.LastError)
}
