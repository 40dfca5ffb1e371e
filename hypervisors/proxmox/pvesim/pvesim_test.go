package pvesim

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	pxapi "github.com/luthermonson/go-proxmox"

	"github.com/bigfleet-vm/provider/hypervisors/guest"
)

func setup(t *testing.T) (*Server, *pxapi.Client) {
	s, c, _ := setupURL(t)
	return s, c
}

func setupURL(t *testing.T) (*Server, *pxapi.Client, *httptest.Server) {
	t.Helper()
	s := New(Options{Nodes: []string{"pve1", "pve2"}, Latencies: ZeroLatency()})
	s.AddToken(Token{ID: "u@pve!t", Secret: "sec", ACL: FullAccess()})
	if err := s.AddVM(VMSpec{VMID: 9000, Node: "pve1", Name: "tmpl", Template: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddVM(VMSpec{VMID: 100, Node: "pve1", Name: "plain"}); err != nil {
		t.Fatal(err)
	}
	srv := s.NewTLSServer()
	t.Cleanup(func() { srv.Close(); s.Close() })
	c := pxapi.NewClient(srv.URL+"/api2/json", pxapi.WithHTTPClient(srv.Client()), pxapi.WithAPIToken("u@pve!t", "sec"))
	return s, c, srv
}

// TestQuirks drives the simulator with the real go-proxmox client and
// checks the PVE behaviours the client depends on.
func TestQuirks(t *testing.T) {
	s, c := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := c.Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	next, err := cl.NextID(ctx) // decodes a JSON string only
	if err != nil || next != 101 {
		t.Fatalf("NextID = %d, %v; want 101", next, err)
	}
	node, err := c.Node(ctx, "pve1")
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := node.VirtualMachine(ctx, 9000)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := node.VirtualMachine(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	if !bool(tmpl.Template) || bool(plain.Template) {
		t.Errorf("Template = %v/%v, want true/false", tmpl.Template, plain.Template)
	}
	_, task, err := tmpl.Clone(ctx, &pxapi.VirtualMachineCloneOptions{NewID: 100, Full: true, Name: "x"})
	if err == nil || err.Error() != "500 VM 100 already exists on node 'pve1'" {
		t.Fatalf("clone onto 100: task %v, err %v; want the reason phrase", task, err)
	}
	_, task, err = tmpl.Clone(ctx, &pxapi.VirtualMachineCloneOptions{NewID: 101, Full: true, Name: "x", Target: "pve2"})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Split(string(task.UPID), ":"); len(got) != 9 || got[0] != "UPID" || got[1] != "pve1" || got[5] != "qmclone" || got[8] != "" {
		t.Errorf("UPID %q does not have PVE's 9-field form", task.UPID)
	}
	if err := task.Wait(ctx, 5*time.Millisecond, 5*time.Second); err != nil || !task.IsSuccessful {
		t.Fatalf("clone task: %v, %+v", err, task)
	}
	s.FailTasks(KindStart, 1, "start failed: QEMU exited with code 1")
	vm, _ := c.Node(ctx, "pve2")
	v, err := vm.VirtualMachine(ctx, 101)
	if err != nil {
		t.Fatal(err)
	}
	task, err = v.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// go-proxmox's Wait returns nil for a failed task: the exit status is
	// the only signal.
	if err := task.Wait(ctx, 5*time.Millisecond, 5*time.Second); err != nil || !task.IsFailed || task.ExitStatus != "start failed: QEMU exited with code 1" {
		t.Errorf("failed start: err %v, failed %v, exit %q", err, task.IsFailed, task.ExitStatus)
	}
	if err := v.AgentPing(ctx); err == nil || err.Error() != "500 VM 101 is not running" {
		t.Errorf("agent ping on stopped VM = %v", err)
	}
	if _, err := node.VirtualMachine(ctx, 555); err == nil || !strings.Contains(err.Error(), "500 Configuration file 'nodes/pve1/qemu-server/555.conf' does not exist") {
		t.Errorf("missing VM error = %v", err)
	}
}

func TestAuthAndPermissions(t *testing.T) {
	s, c, srv := setupURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bad := pxapi.NewClient(srv.URL+"/api2/json", pxapi.WithHTTPClient(srv.Client()), pxapi.WithAPIToken("u@pve!t", "wrong"))
	if _, err := bad.Version(ctx); !pxapi.IsNotAuthorized(err) {
		t.Errorf("wrong secret: %v, want not authorized", err)
	}
	if _, err := c.Version(ctx); err != nil {
		t.Errorf("Version: %v", err)
	}
	s.AddToken(Token{ID: "ro@pve!t", Secret: "x", ACL: map[string][]string{"/vms": {"VM.Audit"}, "/pool/p": {"VM.Allocate"}}})
	perms := map[string]bool{}
	s.mu.Lock()
	for p := range s.privs(s.tokens["ro@pve!t"], "/vms/100") {
		perms[p] = true
	}
	e := s.check(s.tokens["ro@pve!t"], "/vms/9000", "VM.Clone")
	s.mu.Unlock()
	if d := cmp.Diff(map[string]bool{"VM.Audit": true}, perms); d != "" {
		t.Errorf("privs (-want +got):\n%s", d)
	}
	if e == nil || e.Error() != "403 Permission check failed (/vms/9000, VM.Clone)" {
		t.Errorf("check = %v", e)
	}
}

func TestMemGuest(t *testing.T) {
	g := NewMemGuest()
	ctx := context.Background()
	_ = g.FileWrite(ctx, "/a", []byte("echo hi\nexit 4\n"))
	_ = g.FileWrite(ctx, "/p0", []byte("ab"))
	_ = g.FileWrite(ctx, "/p1", []byte("cd"))
	tests := []struct {
		argv []string
		want ExecStatus
	}{
		{[]string{"/bin/sh", "/a"}, ExecStatus{Exited: true, ExitCode: 4, ErrData: []byte("/a: exit 4\n")}},
		{[]string{"/bin/sh", "-c", guest.CommitScript, "sh", "600", "/t", "/p0", "/p1"}, ExecStatus{Exited: true}},
		{[]string{"kubectl", "drain", "x"}, ExecStatus{Exited: true, OutData: []byte("node drained\n")}},
		{[]string{"nope"}, ExecStatus{Exited: true, ExitCode: 127, ErrData: []byte("nope: command not found\n")}},
	}
	for _, tt := range tests {
		pid, _ := g.Exec(ctx, tt.argv, nil)
		got, err := g.ExecStatus(ctx, pid)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(tt.want, got); d != "" {
			t.Errorf("%v (-want +got):\n%s", tt.argv, d)
		}
	}
	if b, _ := g.File("/t"); string(b) != "abcd" {
		t.Errorf("assembled = %q", b)
	}
}

func TestMemGuestScriptStopsAtFirstFailure(t *testing.T) {
	g := NewMemGuest()
	ctx := context.Background()
	run := func(argv ...string) ExecStatus {
		t.Helper()
		pid, err := g.Exec(ctx, argv, nil)
		if err != nil {
			t.Fatal(err)
		}
		st, err := g.ExecStatus(ctx, pid)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	drain := "set -eu\nnode=\"$(hostname)\"\nkubectl cordon \"$node\"\nkubectl drain \"$node\" --ignore-daemonsets"
	if res := run("/bin/sh", "-c", drain); res.ExitCode != 0 {
		t.Fatalf("drain script: %+v", res)
	}
	g.SetCommand([]string{"kubectl", "drain"}, CommandResult{ExitCode: 1, Stderr: "cannot evict pod\n"})
	res := run("/bin/sh", "-c", drain)
	if res.ExitCode != 1 || !strings.Contains(string(res.ErrData), "cannot evict") {
		t.Fatalf("failing drain: %+v", res)
	}
}

// TestStorageConsumption: a full clone takes CloneDiskBytes of the
// template's storage (of the clone's node for a local storage, of the one
// pool for a shared one) until it is destroyed, a clone that does not fit
// fails as qemu-img does, and the template's config names its disks'
// storage.
func TestStorageConsumption(t *testing.T) {
	s := New(Options{Nodes: []string{"pve1", "pve2"}, Latencies: ZeroLatency(),
		Storages: []Storage{{Name: "ceph", Shared: true, Bytes: 100 << 30, FreeBytes: 20 << 30}}})
	s.AddToken(Token{ID: "u@pve!t", Secret: "sec", ACL: FullAccess()})
	if err := s.AddVM(VMSpec{VMID: 9000, Node: "pve1", Name: "tmpl", Template: true, Storage: "ceph",
		Drives: map[string]string{"ide2": "ceph:vm-9000-cloudinit,media=cdrom"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddVM(VMSpec{VMID: 9001, Node: "pve1", Name: "tmpl2", Template: true, Storage: "nfs"}); err == nil {
		t.Error("AddVM on an unknown storage succeeded")
	}
	srv := s.NewTLSServer()
	t.Cleanup(func() { srv.Close(); s.Close() })
	c := pxapi.NewClient(srv.URL+"/api2/json", pxapi.WithHTTPClient(srv.Client()), pxapi.WithAPIToken("u@pve!t", "sec"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	var conf map[string]any
	if err := c.Get(ctx, "/nodes/pve1/qemu/9000/config", &conf); err != nil {
		t.Fatal(err)
	}
	if conf["scsi0"] != "ceph:vm-9000-disk-0,size=8G" || conf["ide2"] != "ceph:vm-9000-cloudinit,media=cdrom" {
		t.Errorf("template config scsi0=%v ide2=%v, want its disks on ceph", conf["scsi0"], conf["ide2"])
	}
	avail := func(node, storage string) uint64 {
		t.Helper()
		n, err := c.Node(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		st, err := n.Storage(ctx, storage)
		if err != nil {
			t.Fatal(err)
		}
		return st.Avail
	}
	node, err := c.Node(ctx, "pve1")
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := node.VirtualMachine(ctx, 9000)
	if err != nil {
		t.Fatal(err)
	}
	clone := func(id int, target string) *pxapi.Task {
		t.Helper()
		_, task, err := tmpl.Clone(ctx, &pxapi.VirtualMachineCloneOptions{NewID: id, Full: true, Name: "x", Target: target})
		if err != nil {
			t.Fatal(err)
		}
		if err := task.Wait(ctx, 5*time.Millisecond, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		return task
	}
	// 20 GiB free: two 8 GiB clones fit, on either node (one shared pool).
	for i, target := range []string{"pve1", "pve2"} {
		if task := clone(101+i, target); !task.IsSuccessful {
			t.Fatalf("clone %d: %s", 101+i, task.ExitStatus)
		}
	}
	if got, want := avail("pve2", "ceph"), uint64(4<<30); got != want || avail("pve1", "ceph") != want {
		t.Errorf("ceph avail after two clones = %d, want %d on every node", got, want)
	}
	task := clone(103, "pve1")
	if !task.IsFailed || !strings.Contains(task.ExitStatus, "No space left on device") {
		t.Errorf("clone past the free space: failed %v, exit %q; want ENOSPC", task.IsFailed, task.ExitStatus)
	}
	if _, ok := s.VM(103); ok {
		t.Error("the clone that did not fit was kept")
	}
	if got := avail("pve1", "ceph"); got != 4<<30 {
		t.Errorf("ceph avail after the failed clone = %d, want 4 GiB", got)
	}
	// The default storage is local: each node has its own, untouched.
	if got := avail("pve1", "local-lvm"); got != 900<<30 {
		t.Errorf("local-lvm avail = %d, want the default 900 GiB", got)
	}
	s.RemoveVM(101)
	if got := avail("pve1", "ceph"); got != 12<<30 {
		t.Errorf("ceph avail after a clone is removed = %d, want 12 GiB", got)
	}
}
