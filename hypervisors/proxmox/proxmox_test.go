package proxmox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/bigfleet-vm/provider/executor"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvemarker"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvesim"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvespec"
	"github.com/bigfleet-vm/provider/naming"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/planner"
	"github.com/bigfleet-vm/provider/retry"
)

func TestTLSAndConfig(t *testing.T) {
	e := newEnv(t, nil, func(c *Config) { c.APIURL = "" })
	_, _, otherFP, err := pvesim.SelfSignedPEM([]string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	_, otherPEM, _, _ := pvesim.SelfSignedPEM([]string{"127.0.0.1"})
	otherCA := e.ca + ".other"
	if err := writeFile(otherCA, otherPEM); err != nil {
		t.Fatal(err)
	}
	base := e.cfg
	base.APIURL = e.srv.URL + "/api2/json"
	base.Fingerprint = ""
	tests := []struct {
		name    string
		mut     func(*Config)
		newErr  string // New fails with this substring
		callErr error  // else the Version call fails with this class (nil: succeeds)
	}{
		{name: "fingerprint pin", mut: func(c *Config) { c.Fingerprint = e.fp }},
		{name: "fingerprint with colons and upper case", mut: func(c *Config) { c.Fingerprint = colons(strings.ToUpper(e.fp)) }},
		{name: "CA file", mut: func(c *Config) { c.CAFile = e.ca }},
		{name: "CA file and pin", mut: func(c *Config) { c.CAFile, c.Fingerprint = e.ca, e.fp }},
		{name: "wrong fingerprint refused", mut: func(c *Config) { c.Fingerprint = otherFP }, callErr: ErrFingerprintMismatch},
		{name: "right CA, wrong pin refused", mut: func(c *Config) { c.CAFile, c.Fingerprint = e.ca, otherFP }, callErr: ErrFingerprintMismatch},
		{name: "wrong CA refused", mut: func(c *Config) { c.CAFile = otherCA }, callErr: hypervisors.ErrPermission},
		{name: "http refused", mut: func(c *Config) { c.APIURL = strings.Replace(c.APIURL, "https://", "http://", 1); c.Fingerprint = e.fp }, newErr: `scheme "http" refused`},
		{name: "no trust anchor refused", mut: func(c *Config) {}, newErr: "set a CA file or a certificate fingerprint"},
		{name: "bad fingerprint syntax", mut: func(c *Config) { c.Fingerprint = "abc" }, newErr: "not a hex SHA-256"},
		{name: "wrong secret is a permission error", mut: func(c *Config) { c.Fingerprint = e.fp; c.TokenSecret = "nope" }, callErr: hypervisors.ErrPermission},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base
			tt.mut(&c)
			a, err := New(c, nil)
			if tt.newErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.newErr) {
					t.Fatalf("New error = %v, want %q", err, tt.newErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			_, err = a.Lookup(ctxT(t, 5*time.Second), hypervisors.Target{Zone: "pve1", VMID: template})
			if tt.callErr == nil && err != nil {
				t.Fatalf("Lookup: %v", err)
			}
			if tt.callErr != nil && !errors.Is(err, tt.callErr) {
				t.Fatalf("Lookup error = %v, want %v", err, tt.callErr)
			}
			if err != nil && strings.Contains(err.Error(), testSecret) {
				t.Fatalf("error leaks the token secret: %v", err)
			}
		})
	}
}

func colons(h string) string {
	var b strings.Builder
	for i := 0; i < len(h); i += 2 {
		if i > 0 {
			b.WriteByte(':')
		}
		b.WriteString(h[i : i+2])
	}
	return b.String()
}

func TestLifecycle(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t, 30*time.Second)
	spec := cloneSpec("m-1")
	id, err := e.a.CloneVM(ctx, "pve2", spec)
	if err != nil {
		t.Fatalf("CloneVM: %v", err)
	}
	tg := hypervisors.Target{Zone: "pve2", VMID: id, Name: spec.Name}
	size := pvespec.SizeSpec{VCPU: 4, MemoryMiB: 8192, OnBoot: true, Marker: marker("m-1")}
	if err := e.a.ConfigureVM(ctx, tg, size); err != nil {
		t.Fatalf("ConfigureVM: %v", err)
	}
	if err := e.a.Start(ctx, tg); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if _, err := waitAgent(ctx, e.a, tg); err != nil {
		t.Fatalf("agent: %v", err)
	}
	got, err := e.a.Lookup(ctx, tg)
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	m := marker("m-1")
	want := &observed.VM{Zone: "pve2", Name: spec.Name, VMID: id, Marker: &m, Power: observed.PowerRunning, VCPU: 4, MemoryMiB: 8192,
		Autostart: true}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("Lookup (-want +got):\n%s", d)
	}
	info, _ := e.sim.VM(id)
	if info.Pool != "fleet" || info.Node != "pve2" {
		t.Errorf("clone placed in pool %q on %q, want fleet on pve2", info.Pool, info.Node)
	}

	blob := []byte("#!/bin/sh\necho joining\nexit 0\n")
	if err := e.a.AgentWriteFile(ctx, tg, "/run/bigfleet-bootstrap", blob, 0o600); err != nil {
		t.Fatalf("AgentWriteFile: %v", err)
	}
	g := e.sim.GuestOf(id).(*pvesim.MemGuest)
	if b, _ := g.File("/run/bigfleet-bootstrap"); !bytes.Equal(b, blob) {
		t.Errorf("guest file = %q, want %q", b, blob)
	}
	res, err := e.a.AgentExec(ctx, tg, []string{"/bin/sh", "/run/bigfleet-bootstrap"})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("bootstrap exec = %+v, %v", res, err)
	}
	res, err = e.a.AgentExec(ctx, tg, []string{"kubectl", "drain", "guest", "--ignore-daemonsets"})
	if err != nil || res.ExitCode != 0 || string(res.Stdout) != "node drained\n" {
		t.Fatalf("drain exec = %+v, %v", res, err)
	}
	if err := e.a.AgentRemoveFile(ctx, tg, "/run/bigfleet-bootstrap"); err != nil {
		t.Fatalf("AgentRemoveFile: %v", err)
	}
	if _, ok := g.File("/run/bigfleet-bootstrap"); ok {
		t.Error("bootstrap file still present after AgentRemoveFile")
	}
	if err := e.a.Stop(ctx, tg, time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if info, _ := e.sim.VM(id); info.Status != "stopped" {
		t.Errorf("after Stop status = %q", info.Status)
	}
	if err := e.a.DeleteVM(ctx, tg); err != nil {
		t.Fatalf("DeleteVM: %v", err)
	}
	if _, ok := e.sim.VM(id); ok {
		t.Error("VM still exists after DeleteVM")
	}
	if err := e.a.DeleteVM(ctx, tg); err != nil {
		t.Errorf("DeleteVM of a gone VM = %v, want nil", err)
	}
	if err := e.a.Stop(ctx, tg, 0); err != nil {
		t.Errorf("Stop of a gone VM = %v, want nil", err)
	}
}

func TestConcurrentClonesCollidingNextID(t *testing.T) {
	e := newEnv(t, nil, func(c *Config) { c.CloneConcurrency = 20 })
	// A second provider process on the same cluster: its allocator knows
	// nothing of the first's reservations.
	b, err := New(e.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.sim.FixNextID(100) // every caller is told 100, free or not
	ctx := ctxT(t, 60*time.Second)
	var wg sync.WaitGroup
	ids := make([]int, 20)
	errs := make([]error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ad := e.a
			if i%2 == 1 {
				ad = b
			}
			ids[i], errs[i] = ad.CloneVM(ctx, "pve1", cloneSpec(fmt.Sprintf("m-%02d", i)))
		}()
	}
	wg.Wait()
	seen := map[int]int{}
	for i, err := range errs {
		if err != nil {
			t.Errorf("clone %d: %v", i, err)
		}
		if j, dup := seen[ids[i]]; dup {
			t.Errorf("clones %d and %d both got VMID %d", i, j, ids[i])
		}
		seen[ids[i]] = i
	}
	for i, id := range ids {
		info, ok := e.sim.VM(id)
		if m := pvemarker.ParseDescription(info.Description); !ok || m == nil || m.MachineID != fmt.Sprintf("m-%02d", i) {
			t.Errorf("VM %d does not carry the marker of m-%02d: %+v", id, i, info)
		}
	}
	if n := e.sim.RequestCount("/clone"); n <= 20 {
		t.Errorf("clone requests = %d: no VMID collision was exercised", n)
	} else {
		t.Logf("%d clone requests for 20 clones (%d collisions resolved)", n, n-20)
	}
	if n := len(e.sim.VMIDs()); n != 21 {
		t.Errorf("cluster has %d VMs, want 20 clones + template", n)
	}
}

func TestCloneFailures(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(e *env)
		wantErr error
		calls   string // request key counted
		want    int
	}{
		{
			name:    "failed clone task surfaces",
			setup:   func(e *env) { e.sim.FailTasks(pvesim.KindClone, -1, "clone failed: storage 'local-lvm' is full") },
			wantErr: hypervisors.ErrTransient,
		},
		{
			// ENOSPC in the task's exit status: the resource is named and
			// the step is terminal, so the machine fails saying so.
			name: "clone out of storage space is named",
			setup: func(e *env) {
				e.sim.FailTasks(pvesim.KindClone, -1, "clone failed: qemu-img: error while writing at byte 2147483648: No space left on device")
			},
			wantErr: hypervisors.ErrNoResources,
		},
		{
			name: "403 on clone is not retried",
			setup: func(e *env) {
				e.sim.InjectForbidden(pvesim.Match{Method: "POST", Path: "/clone"}, -1, "/vms/9000", "VM.Clone")
			},
			wantErr: hypervisors.ErrPermission,
			calls:   "POST /nodes/pve1/qemu/9000/clone", want: 1,
		},
		{
			name:    "missing template",
			setup:   func(e *env) { e.sim.RemoveVM(template) },
			wantErr: hypervisors.ErrNotFound,
		},
		{
			// Every VMID asked for is taken: the collisions are bounded
			// by retry.VMIDCollision, one clone request per attempt.
			name: "vmid collisions end after the policy's attempts",
			setup: func(e *env) {
				e.sim.InjectStatus(pvesim.Match{Method: "POST", Path: "/clone"}, -1, 500, "VM 100 already exists on node 'pve1'")
			},
			wantErr: hypervisors.ErrExists,
			calls:   "POST /nodes/pve1/qemu/9000/clone", want: retry.VMIDCollision.Attempts,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, nil, nil)
			tt.setup(e)
			_, err := e.a.CloneVM(ctxT(t, 10*time.Second), "pve1", cloneSpec("m-x"))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("CloneVM error = %v, want %v", err, tt.wantErr)
			}
			var re *hypervisors.ResourceError
			if errors.Is(tt.wantErr, hypervisors.ErrNoResources) && (!errors.As(err, &re) || re.Resource != "disk" || hypervisors.Retryable(err)) {
				t.Fatalf("CloneVM error = %v: want a terminal ResourceError naming disk", err)
			}
			if tt.calls != "" {
				if got := e.sim.RequestCount(tt.calls); got != tt.want {
					t.Errorf("%s requests = %d, want %d", tt.calls, got, tt.want)
				}
			}
			if n := len(e.sim.VMIDs()); n != 1 && tt.name != "missing template" {
				t.Errorf("cluster has %d VMs after failed clone, want only the template", n)
			}
		})
	}
}

// Retries happen in one place: the adapter makes one request per call and
// classifies its failure; the executor retries the step by class. So a
// lock error costs one PUT per executor attempt, never attempts times the
// adapter's own retries.
func TestConfigureRetriedByTheExecutorOnly(t *testing.T) {
	tests := []struct {
		name     string
		inject   func(s *pvesim.Server)
		deadline time.Duration
		wantErr  error
		wantPUTs int // -1: one per attempt, however many the deadline allowed
	}{
		{name: "lock errors twice then success", inject: func(s *pvesim.Server) { s.InjectLockErrors(pvesim.Match{Method: "PUT", Path: "/config"}, 2) }, wantPUTs: 3},
		{name: "500 once then success", inject: func(s *pvesim.Server) {
			s.InjectStatus(pvesim.Match{Method: "PUT", Path: "/config"}, 1, 500, "got unexpected error")
		}, wantPUTs: 2},
		{name: "403 is not retried", inject: func(s *pvesim.Server) {
			s.InjectForbidden(pvesim.Match{Method: "PUT", Path: "/config"}, -1, "/vms/100", "VM.Config.CPU")
		}, wantErr: hypervisors.ErrPermission, wantPUTs: 1},
		{name: "lock until the deadline", inject: func(s *pvesim.Server) { s.InjectLockErrors(pvesim.Match{Method: "PUT", Path: "/config"}, -1) },
			deadline: 300 * time.Millisecond, wantErr: context.DeadlineExceeded, wantPUTs: -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, nil, nil)
			ctx := ctxT(t, 10*time.Second)
			id, err := e.a.CloneVM(ctx, "pve1", cloneSpec("m-1"))
			if err != nil {
				t.Fatal(err)
			}
			tg := hypervisors.Target{Zone: "pve1", VMID: id}
			size := pvespec.SizeSpec{VCPU: 2, MemoryMiB: 2048, Marker: marker("m-1")}
			put := fmt.Sprintf("PUT /nodes/pve1/qemu/%d/config", id)
			read := fmt.Sprintf("GET /nodes/pve1/qemu/%d/status/current", id)

			// The adapter alone: one request, a classified error.
			tt.inject(e.sim)
			puts := e.sim.RequestCount(put)
			err = e.a.ConfigureVM(ctx, tg, size)
			if got := e.sim.RequestCount(put) - puts; got != 1 {
				t.Errorf("one ConfigureVM made %d PUTs, want 1", got)
			}
			if err == nil || hypervisors.Retryable(err) == errors.Is(err, hypervisors.ErrPermission) {
				t.Errorf("ConfigureVM = %v (retryable %v)", err, hypervisors.Retryable(err))
			}

			// Through the executor.
			e.sim.ClearFaults()
			tt.inject(e.sim)
			puts, reads := e.sim.RequestCount(put), e.sim.RequestCount(read)
			rctx := ctx
			if tt.deadline > 0 {
				rctx = ctxT(t, tt.deadline)
			}
			ex := executor.New(executor.Options{Hypervisor: e.a, Installation: testInst, MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
			_, err = ex.Run(rctx, planner.Change{Machine: "m-1", Steps: []planner.Step{{ID: "pve1/vm/configure-vm", Action: planner.Action(pvespec.ActionConfigureVM),
				Target: tg, Params: planner.Params{Plugin: &size}}}}, "op")
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("Run = %v, want %v", err, tt.wantErr)
			}
			gotPUTs, attempts := e.sim.RequestCount(put)-puts, e.sim.RequestCount(read)-reads
			if tt.wantPUTs >= 0 && gotPUTs != tt.wantPUTs {
				t.Errorf("PUT config requests = %d, want %d", gotPUTs, tt.wantPUTs)
			}
			// One PUT per attempt (the deadline may end the last one
			// between its read and its PUT).
			if gotPUTs > attempts || gotPUTs < attempts-1 {
				t.Errorf("%d PUTs in %d attempts: retries are nested", gotPUTs, attempts)
			}
		})
	}
}

func TestAgentNotRunningThenReady(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t, 10*time.Second)
	id, err := e.a.CloneVM(ctx, "pve1", cloneSpec("m-1"))
	if err != nil {
		t.Fatal(err)
	}
	tg := hypervisors.Target{Zone: "pve1", VMID: id}
	if err := e.a.AgentPing(ctx, tg); !errors.Is(err, hypervisors.ErrAgentNotReady) {
		t.Fatalf("AgentPing on a stopped VM = %v, want ErrAgentNotReady", err)
	}
	if err := e.a.Start(ctx, tg); err != nil {
		t.Fatal(err)
	}
	e.sim.AgentDownFor(id, 300*time.Millisecond)
	n, err := waitAgent(ctx, e.a, tg)
	if err != nil {
		t.Fatalf("agent never ready: %v", err)
	}
	if n == 0 {
		t.Error("agent answered at once; want ErrAgentNotReady first")
	}
}

func TestHookExitNonZero(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t, 10*time.Second)
	id, err := e.a.CloneVM(ctx, "pve1", cloneSpec("m-1"))
	if err != nil {
		t.Fatal(err)
	}
	tg := hypervisors.Target{Zone: "pve1", VMID: id}
	if err := e.a.Start(ctx, tg); err != nil {
		t.Fatal(err)
	}
	if _, err := waitAgent(ctx, e.a, tg); err != nil {
		t.Fatal(err)
	}
	e.sim.GuestOf(id).(*pvesim.MemGuest).SetCommand([]string{"kubectl"}, pvesim.CommandResult{
		ExitCode: 1, Stderr: "error: unable to drain node \"guest\": pods blocked by PDB\n", Polls: 3})
	tests := []struct {
		name   string
		blob   string
		argv   []string
		want   int
		stderr string
	}{
		{name: "bootstrap exits 3", blob: "set -e\nkubeadm join ...\nexit 3\n", argv: []string{"/bin/sh", "/run/bigfleet-bootstrap"}, want: 3, stderr: "exit 3"},
		{name: "drain blocked", argv: []string{"kubectl", "drain", "guest"}, want: 1, stderr: "pods blocked by PDB"},
		{name: "unknown command", argv: []string{"/no/such"}, want: 127, stderr: "command not found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.blob != "" {
				if err := e.a.AgentWriteFile(ctx, tg, "/run/bigfleet-bootstrap", []byte(tt.blob), 0); err != nil {
					t.Fatal(err)
				}
			}
			res, err := e.a.AgentExec(ctx, tg, tt.argv)
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != tt.want || !strings.Contains(string(res.Stderr), tt.stderr) {
				t.Errorf("exec = exit %d stderr %q, want exit %d with %q", res.ExitCode, res.Stderr, tt.want, tt.stderr)
			}
		})
	}
}

func TestLargeWriteIsChunked(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t, 10*time.Second)
	id, err := e.a.CloneVM(ctx, "pve1", cloneSpec("m-1"))
	if err != nil {
		t.Fatal(err)
	}
	tg := hypervisors.Target{Zone: "pve1", VMID: id}
	if err := e.a.Start(ctx, tg); err != nil {
		t.Fatal(err)
	}
	if _, err := waitAgent(ctx, e.a, tg); err != nil {
		t.Fatal(err)
	}
	blob := bytes.Repeat([]byte("0123456789abcdef"), 200<<10/16+3) // ~200 KiB: 5 chunks
	if err := e.a.AgentWriteFile(ctx, tg, "/run/big", blob, 0o640); err != nil {
		t.Fatalf("AgentWriteFile: %v", err)
	}
	g := e.sim.GuestOf(id).(*pvesim.MemGuest)
	got, _ := g.File("/run/big")
	if !bytes.Equal(got, blob) {
		t.Errorf("assembled file is %d bytes, want %d (equal content)", len(got), len(blob))
	}
	if diff := cmp.Diff([]string{"/run/big"}, g.Files()); diff != "" {
		t.Errorf("guest files (-want +got):\n%s", diff)
	}
	if m := g.Mode("/run/big"); m != "0640" {
		t.Errorf("mode = %q, want 0640", m)
	}
	if n := e.sim.RequestCount("/agent/file-write"); n != 5 {
		t.Errorf("file-write requests = %d, want 5", n)
	}
}

func TestCrashBetweenCloneAndSizing(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t, 10*time.Second)
	spec := cloneSpec("m-7")
	id, err := e.a.CloneVM(ctx, "pve1", spec)
	if err != nil {
		t.Fatal(err)
	}
	// The process dies here; a new one re-runs the step.
	b, err := New(e.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	id2, err := b.CloneVM(ctx, "pve1", spec)
	if err != nil || id2 != id {
		t.Fatalf("second CloneVM = %d, %v; want adoption of %d", id2, err, id)
	}
	if n := e.sim.RequestCount("/clone"); n != 1 {
		t.Errorf("clone requests = %d, want 1", n)
	}
	tg := hypervisors.Target{Zone: "pve1", VMID: id}
	if err := b.ConfigureVM(ctx, tg, pvespec.SizeSpec{VCPU: 8, MemoryMiB: 16384, OnBoot: true, Marker: marker("m-7")}); err != nil {
		t.Fatal(err)
	}
	info, _ := e.sim.VM(id)
	got := []any{info.Cores, info.MemoryMiB, info.OnBoot}
	if d := cmp.Diff([]any{8, 16384, true}, got); d != "" {
		t.Errorf("size after adoption (-want +got):\n%s", d)
	}
}

func TestOwnershipAndOutOfBand(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	e := newEnv(t, nil, func(c *Config) { c.Now = clock })
	ctx := ctxT(t, 10*time.Second)
	id, err := e.a.CloneVM(ctx, "pve1", cloneSpec("m-1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.a.ConfigureVM(ctx, hypervisors.Target{Zone: "pve1", VMID: id}, pvespec.SizeSpec{VCPU: 2, MemoryMiB: 2048, Marker: marker("m-1")}); err != nil {
		t.Fatal(err)
	}
	lookalike := naming.VMName(testInst, "m-2", 1)
	other := observed.Marker{Installation: "someone-else", MachineID: "m-3"}
	foreign := []pvesim.VMSpec{
		// our name and tags, but no marker: never adopted
		{VMID: 500, Node: "pve1", Name: lookalike, Tags: pvemarker.Tags(marker("m-2"))},
		// another installation's marker under our tags
		{VMID: 501, Node: "pve1", Name: "x", Tags: pvemarker.Tags(marker("m-3")), Description: pvemarker.Description(other)},
	}
	for _, f := range foreign {
		if err := e.sim.AddVM(f); err != nil {
			t.Fatal(err)
		}
	}
	z, err := e.a.Observe(ctx, "pve1")
	if err != nil {
		t.Fatal(err)
	}
	owners := map[int]string{}
	for _, v := range z.VMs {
		owners[v.VMID] = "foreign"
		if v.Marker != nil {
			owners[v.VMID] = v.Marker.MachineID
		}
	}
	want := map[int]string{template: "foreign", id: "m-1", 500: "foreign", 501: "foreign"}
	if d := cmp.Diff(want, owners); d != "" {
		t.Errorf("ownership (-want +got):\n%s", d)
	}
	if err := e.a.DeleteVM(ctx, hypervisors.Target{Zone: "pve1", VMID: 500}); !errors.Is(err, hypervisors.ErrNotOwned) {
		t.Errorf("DeleteVM of a look-alike = %v, want ErrNotOwned", err)
	}
	if id2, err := e.a.CloneVM(ctx, "pve1", cloneSpec("m-2")); err != nil || id2 == 500 {
		t.Errorf("CloneVM for m-2 = %d, %v; want a new VM, not the look-alike", id2, err)
	}

	e.sim.RemoveVM(id) // out of band
	if _, err := e.a.Lookup(ctx, hypervisors.Target{Zone: "pve1", VMID: id}); !errors.Is(err, hypervisors.ErrNotFound) {
		t.Errorf("Lookup of a removed VM = %v, want ErrNotFound", err)
	}
	advance(time.Minute)
	z, err = e.a.Observe(ctx, "pve1")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range z.VMs {
		if v.VMID == id {
			t.Errorf("Observe still lists removed VM %d", id)
		}
	}
}

func TestObserveUnknownOnFailure(t *testing.T) {
	e := newEnv(t, nil, nil)
	e.sim.InjectStatus(pvesim.Match{Path: "/cluster/resources"}, -1, 500, "cluster not ready - no quorum?")
	z, err := e.a.Observe(ctxT(t, 10*time.Second), "pve2")
	if !errors.Is(err, hypervisors.ErrTransient) {
		t.Fatalf("Observe error = %v, want ErrTransient", err)
	}
	if z == nil || z.Status != observed.StatusUnknown || len(z.VMs) != 0 {
		t.Errorf("zone = %+v, want unknown and empty", z)
	}
}

// TestErrorStatusesAreErrors: go-proxmox reports only 400, 401, 403, 500
// and 501 as errors and decoded the {"data":null} body of any other error
// status into an empty result, so a 503 from a proxy in front of PVE (or
// PVE's 595 for an unreachable node) listed the cluster as empty and read
// a VM as blank. Each must be an error of the right class instead.
func TestErrorStatusesAreErrors(t *testing.T) {
	tests := []struct {
		code  int
		class error
	}{
		{502, hypervisors.ErrTransient},
		{503, hypervisors.ErrTransient},
		{504, hypervisors.ErrTransient},
		{595, hypervisors.ErrTransient},
		{404, hypervisors.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.code), func(t *testing.T) {
			e := newEnv(t, nil, nil)
			reason := "Errors during connection establishment, proxy handler: " + strings.Repeat("x", 500)
			e.sim.InjectStatus(pvesim.Match{Path: "/cluster/resources"}, -1, tt.code, reason)
			z, err := e.a.Observe(ctxT(t, 10*time.Second), "pve1")
			if !errors.Is(err, tt.class) {
				t.Errorf("Observe error = %v, want %v", err, tt.class)
			}
			if z == nil || z.Status != observed.StatusUnknown || len(z.VMs) != 0 {
				t.Errorf("zone = %+v, want unknown", z)
			}
			if err != nil && len(err.Error()) > 500 {
				t.Errorf("error echoes the whole reason phrase (%d bytes)", len(err.Error()))
			}
			e.sim.InjectStatus(pvesim.Match{Path: "/status/current"}, -1, tt.code, "Service Unavailable")
			if _, err := e.a.Lookup(ctxT(t, 10*time.Second), hypervisors.Target{Zone: "pve1", VMID: template}); !errors.Is(err, tt.class) {
				t.Errorf("Lookup error = %v, want %v", err, tt.class)
			}
		})
	}
}

func TestPreflight(t *testing.T) {
	tests := []struct {
		name      string
		acl       map[string][]string
		templates []int
		nodes     []string
		version   string
		want      []string // substrings, every one must be reported
	}{
		{name: "all good", acl: pvesim.FullAccess(), templates: []int{template}},
		{
			name: "missing VM.Clone on the template and everything on the pool",
			acl: map[string][]string{
				"/vms/9000": {"VM.Audit"}, "/storage": {"Datastore.AllocateSpace"}, "/nodes": {"Sys.Audit"},
			},
			templates: []int{template},
			want:      []string{"lacks privilege VM.Clone on /vms/9000", "lacks privilege VM.Allocate on /pool/fleet", "lacks privilege VM.Monitor on /pool/fleet"},
		},
		{
			name: "PVE 9 wants guest agent privileges", version: "9.0.3",
			acl: map[string][]string{"/": {"VM.Allocate", "VM.Audit", "VM.Clone", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Options",
				"VM.PowerMgmt", "VM.Monitor", "Datastore.AllocateSpace", "Pool.Audit"}},
			templates: []int{template},
			want:      []string{"VM.GuestAgent.Audit on /pool/fleet", "VM.GuestAgent.Unrestricted on /pool/fleet"},
		},
		{
			name: "every problem at once", acl: pvesim.FullAccess(), templates: []int{template, 7777, 100},
			nodes: []string{"pve1", "pve9"},
			want:  []string{`node "pve9" does not exist`, "template vm 7777 does not exist", "vm 100 (plain) is not a template"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := pvesim.Options{Nodes: []string{"pve1", "pve2", "pve3"}, Latencies: pvesim.ZeroLatency(), Version: tt.version}
			e := newEnv(t, &o, func(c *Config) {
				if tt.nodes != nil {
					c.Nodes = tt.nodes
				}
			})
			_ = e.sim.AddVM(pvesim.VMSpec{VMID: 100, Node: "pve1", Name: "plain"})
			e.sim.AddToken(pvesim.Token{ID: testToken, Secret: testSecret, ACL: tt.acl})
			err := e.a.Preflight(ctxT(t, 10*time.Second), tt.templates)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Preflight: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Preflight passed, want errors")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Preflight error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestStopGraceful(t *testing.T) {
	tests := []struct {
		name     string
		ignore   bool
		wantStop int // hard stops
	}{
		{name: "guest honours shutdown", wantStop: 0},
		{name: "guest ignores shutdown: powered off after grace", ignore: true, wantStop: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, nil, nil)
			ctx := ctxT(t, 20*time.Second)
			id, err := e.a.CloneVM(ctx, "pve1", cloneSpec("m-1"))
			if err != nil {
				t.Fatal(err)
			}
			tg := hypervisors.Target{Zone: "pve1", VMID: id}
			if err := e.a.Start(ctx, tg); err != nil {
				t.Fatal(err)
			}
			e.sim.IgnoreShutdown(id, tt.ignore)
			if err := e.a.Stop(ctx, tg, time.Second); err != nil {
				t.Fatalf("Stop: %v", err)
			}
			info, _ := e.sim.VM(id)
			if info.Status != "stopped" {
				t.Errorf("status = %q, want stopped", info.Status)
			}
			if n := e.sim.RequestCount("/status/stop"); n != tt.wantStop {
				t.Errorf("hard stops = %d, want %d", n, tt.wantStop)
			}
		})
	}
}

func TestResumePaused(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t, 10*time.Second)
	id, err := e.a.CloneVM(ctx, "pve1", cloneSpec("m-1"))
	if err != nil {
		t.Fatal(err)
	}
	tg := hypervisors.Target{Zone: "pve1", VMID: id}
	if err := e.a.Start(ctx, tg); err != nil {
		t.Fatal(err)
	}
	e.sim.SetPaused(id, true)
	if v, _ := e.a.Lookup(ctx, tg); v == nil || v.Power != observed.PowerPaused {
		t.Fatalf("Lookup power = %+v, want paused", v)
	}
	if err := e.a.Start(ctx, tg); err != nil {
		t.Fatal(err)
	}
	if info, _ := e.sim.VM(id); info.Paused {
		t.Error("VM still paused after Start")
	}
}

func writeFile(p string, b []byte) error { return osWriteFile(p, b) }

// TestExecStatusAsPVESendsIt runs commands whose exec-status carries what
// PVE passes on from a current qemu-ga: truncation flags as 1/0 whenever a
// stream has data, and "signal" instead of "exitcode" for a killed
// process. go-proxmox's AgentExecStatus cannot decode these (bool fields).
func TestExecStatusAsPVESendsIt(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t, 10*time.Second)
	if err := e.sim.AddVM(pvesim.VMSpec{VMID: 500, Node: "pve1", Name: "guest", Running: true}); err != nil {
		t.Fatal(err)
	}
	g := e.sim.GuestOf(500).(*pvesim.MemGuest)
	g.SetCommand([]string{"noisy"}, pvesim.CommandResult{Stdout: "out\n", Stderr: "warning: deprecated\n"})
	g.SetCommand([]string{"flood"}, pvesim.CommandResult{ExitCode: 2, Stdout: "x", Stderr: "y", OutTruncated: true, ErrTruncated: true})
	g.SetCommand([]string{"killed"}, pvesim.CommandResult{Signal: 9, Stderr: "partial\n", Polls: 1})
	tg := hypervisors.Target{Zone: "pve1", VMID: 500}
	tests := []struct {
		argv []string
		want hypervisors.ExecResult
	}{
		{[]string{"noisy"}, hypervisors.ExecResult{ExitCode: 0, Stdout: []byte("out\n"), Stderr: []byte("warning: deprecated\n")}},
		{[]string{"flood"}, hypervisors.ExecResult{ExitCode: 2, Stdout: []byte("x"), Stderr: []byte("y")}},
		{[]string{"killed"}, hypervisors.ExecResult{ExitCode: 128 + 9, Stderr: []byte("partial\n")}},
	}
	for _, tt := range tests {
		t.Run(tt.argv[0], func(t *testing.T) {
			got, err := e.a.AgentExec(ctx, tg, tt.argv)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("AgentExec(%q) (-want +got):\n%s", tt.argv, diff)
			}
		})
	}
}
