//go:build integration

package proxmox

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/guest"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvesim"
)

// startQGA runs a host qemu-ga on a unix socket with dangerous RPCs
// blocked. Without qemu-ga it skips on developer machines and fails in CI.
func startQGA(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("qemu-ga")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/qemu-ga"); serr == nil {
			bin = "/usr/sbin/qemu-ga"
		} else if os.Getenv("CI") == "" {
			t.Skip("qemu-ga not installed (apt-get install qemu-guest-agent); CI installs it")
		} else {
			t.Fatal("CI is set but qemu-ga is not installed: .ci/run must install qemu-guest-agent")
		}
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "qga.sock")
	if err := os.Mkdir(filepath.Join(dir, "state"), 0o700); err != nil {
		t.Fatal(err)
	}
	flag := "--block-rpcs"
	if help, _ := exec.Command(bin, "--help").CombinedOutput(); !bytes.Contains(help, []byte("--block-rpcs")) {
		flag = "--blacklist"
	}
	cmd := exec.Command(bin, "-m", "unix-listen", "-p", sock, "-t", filepath.Join(dir, "state"),
		"-f", filepath.Join(dir, "qga.pid"), flag+"=guest-shutdown,guest-suspend-disk,guest-suspend-ram,guest-suspend-hybrid,"+
			"guest-set-time,guest-fsfreeze-freeze,guest-fsfreeze-freeze-list,guest-fsfreeze-thaw,guest-set-user-password,"+
			"guest-set-vcpus,guest-set-memory-blocks")
	var logs bytes.Buffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start qemu-ga: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for i := 0; i < 200; i++ {
		if _, err := os.Stat(sock); err == nil {
			return sock
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("qemu-ga socket never appeared: %s", logs.String())
	return ""
}

func TestRealQGA(t *testing.T) {
	sock := startQGA(t)
	root := t.TempDir()
	e := newEnv(t, nil, nil)
	e.sim.SetGuestFactory(func(int) pvesim.Guest { return &pvesim.QGAGuest{Socket: sock, Root: root} })
	ctx := ctxT(t, 60*time.Second)
	id, err := e.a.CloneVM(ctx, "pve1", cloneSpec("m-qga"))
	if err != nil {
		t.Fatal(err)
	}
	tg := hypervisors.Target{Zone: "pve1", VMID: id}
	if err := e.a.Start(ctx, tg); err != nil {
		t.Fatal(err)
	}
	if _, err := waitAgent(ctx, e.a, tg); err != nil {
		t.Fatalf("agent: %v", err)
	}

	big := bytes.Repeat([]byte("bigfleet-chunk\n"), 150<<10/15) // 150 KiB: 4 chunks, joined by real /bin/sh
	if err := e.a.AgentWriteFile(ctx, tg, "/run/big", big, 0o640); err != nil {
		t.Fatalf("large AgentWriteFile: %v", err)
	}
	got, err := os.ReadFile(filepath.Join(root, "run/big"))
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("assembled file: %d bytes (want %d), err %v", len(got), len(big), err)
	}
	if st, _ := os.Stat(filepath.Join(root, "run/big")); st.Mode().Perm() != 0o640 {
		t.Errorf("mode = %v, want 0640", st.Mode().Perm())
	}
	parts, _ := filepath.Glob(filepath.Join(root, "run/big.bf-*"))
	if len(parts) != 0 {
		t.Errorf("chunk files left behind: %v", parts)
	}

	tests := []struct {
		name   string
		blob   string
		want   int
		stdout string
		stderr string
	}{
		{name: "bootstrap succeeds", blob: "echo joined\n", want: 0, stdout: "joined"},
		{name: "bootstrap fails", blob: "echo partial\necho 'kubeadm: token expired' >&2\nexit 3\n", want: 3, stdout: "partial", stderr: "token expired"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := e.a.AgentWriteFile(ctx, tg, "/run/bigfleet-bootstrap", []byte(tt.blob), 0o600); err != nil {
				t.Fatal(err)
			}
			res, err := e.a.AgentExec(ctx, tg, []string{"/bin/sh", "/run/bigfleet-bootstrap"})
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != tt.want || !strings.Contains(string(res.Stdout), tt.stdout) || !strings.Contains(string(res.Stderr), tt.stderr) {
				t.Errorf("exec = exit %d out %q err %q; want exit %d, %q, %q", res.ExitCode, res.Stdout, res.Stderr, tt.want, tt.stdout, tt.stderr)
			}
		})
	}
	if err := e.a.AgentRemoveFile(ctx, tg, "/run/bigfleet-bootstrap"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "run/bigfleet-bootstrap")); !os.IsNotExist(err) {
		t.Errorf("bootstrap file still present: %v", err)
	}
}

// The guest-op wrapper on a real qemu-ga, through the simulator's agent
// endpoints and the real go-proxmox client (paths sandboxed under a temp
// root): the blob is staged and put in place, the command runs once, a
// second run for the same key reports the recorded end instead of running
// it again, and nothing of the blob stays.
func TestRealQGARecordedCommand(t *testing.T) {
	sock := startQGA(t)
	root := t.TempDir()
	e := newEnv(t, nil, nil)
	e.sim.SetGuestFactory(func(int) pvesim.Guest { return &pvesim.QGAGuest{Socket: sock, Root: root} })
	ctx := ctxT(t, 60*time.Second)
	id, err := e.a.CloneVM(ctx, "pve1", cloneSpec("m-rec"))
	if err != nil {
		t.Fatal(err)
	}
	tg := hypervisors.Target{Zone: "pve1", VMID: id}
	if err := e.a.Start(ctx, tg); err != nil {
		t.Fatal(err)
	}
	if _, err := waitAgent(ctx, e.a, tg); err != nil {
		t.Fatalf("agent: %v", err)
	}
	ga, err := e.a.agent(tg)
	if err != nil {
		t.Fatal(err)
	}
	runs := "/var/lib/bigfleet-test-runs"
	op := guest.Op{Key: "op-7-bootstrap", Argv: []string{"sh", "-c", // "sh": every absolute argument is sandboxed
		`echo run >> "$0"; cat "$1"; exit 3`, runs, "/run/bigfleet-bootstrap"},
		Stage: &guest.Stage{Target: "/run/bigfleet-bootstrap", Data: []byte("joined with the blob\n"), Have: true}}
	for i := range 2 {
		out, err := guest.Run(ctx, ga, op)
		if err != nil || out.ExitCode != 3 || string(out.Output) != "joined with the blob\n" {
			t.Fatalf("run %d: %+v (output %q), %v", i, out, out.Output, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(root, runs)); err != nil || string(b) != "run\n" {
		t.Errorf("the command ran %q (%v), want once", b, err)
	}
	for _, p := range []string{"run/bigfleet-bootstrap", "run/bigfleet/stage/op-7-bootstrap"} {
		if _, err := os.Stat(filepath.Join(root, p)); !os.IsNotExist(err) {
			t.Errorf("%s left behind: %v", p, err)
		}
	}
	rec, err := os.ReadFile(filepath.Join(root, "var/lib/bigfleet/ops/op-7-bootstrap/exit"))
	if err != nil || string(rec) != "3\n" {
		t.Errorf("recorded exit %q, %v", rec, err)
	}
}
