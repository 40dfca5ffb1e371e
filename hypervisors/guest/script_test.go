package guest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// shells are the POSIX shells the wrapper is tested with: the host's
// /bin/sh (dash on Debian) and, when the test guest was built
// (scripts/libvirt-up.sh), the busybox ash the tiny guest runs.
func shells(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{"sh": "/bin/sh"}
	bb := os.Getenv("BIGFLEET_BUSYBOX")
	if bb == "" {
		state := os.Getenv("BIGFLEET_LIBVIRT_STATE")
		if state == "" {
			state = "/var/lib/bigfleet-test"
		}
		bb = filepath.Join(state, "guest/root/bin/busybox")
	}
	if _, err := os.Stat(bb); err == nil {
		// Run it as "sh" (as the guest's /bin/sh symlink does), so its
		// argv is the one the wrapper reads runners by.
		link := filepath.Join(t.TempDir(), "sh")
		if err := os.Symlink(bb, link); err != nil {
			t.Fatal(err)
		}
		out["busybox"] = link
	}
	return out
}

// box is a guest file system for the wrapper: records, claims, staging,
// and a boot id.
type box struct {
	t       *testing.T
	sh      string
	dir     string
	script  string
	boot    string
	records string
	claims  string
}

func newBox(t *testing.T, sh string) *box {
	dir := t.TempDir()
	b := &box{t: t, sh: sh, dir: dir, script: filepath.Join(dir, "op-v1.sh"), boot: "boot-1",
		records: filepath.Join(dir, "var/ops"), claims: filepath.Join(dir, "run/ops")}
	if err := os.WriteFile(b.script, []byte(Script), 0o600); err != nil {
		t.Fatal(err)
	}
	return b
}

// cmd is the wrapper for key with extra arguments (options, "--", argv).
func (b *box) cmd(ctx context.Context, key string, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, b.sh, append([]string{b.script, "run", b.records, b.claims, key}, args...)...)
	c.Env = append(os.Environ(), "BIGFLEET_BOOT_ID="+b.boot)
	return c
}

// run runs the wrapper and parses its report.
func (b *box) run(key string, args ...string) report {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	c := b.cmd(ctx, key, args...)
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		b.t.Fatalf("wrapper %s %v: %v (stderr %q)", key, args, err, stderr.String())
	}
	r, err := parseReport(stdout.Bytes())
	if err != nil {
		b.t.Fatalf("wrapper %s %v: %v (stderr %q)", key, args, err, stderr.String())
	}
	return r
}

// counter is a command that appends a line to a file each time it runs,
// then runs the rest of its argument as a script.
func (b *box) counter(name, script string) []string {
	return []string{"/bin/sh", "-c", `echo run >> "$0"; ` + script, filepath.Join(b.dir, name)}
}

func (b *box) runs(name string) int {
	data, _ := os.ReadFile(filepath.Join(b.dir, name))
	return strings.Count(string(data), "run\n")
}

func (b *box) noTemp() {
	b.t.Helper()
	_ = filepath.Walk(b.dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && strings.HasSuffix(p, ".tmp") {
			b.t.Errorf("temporary file left: %s", p)
		}
		return nil
	})
}

type got struct {
	State string
	Code  int
	Out   string
	Runs  int
}

func TestWrapperRunsOnceAndReports(t *testing.T) {
	for name, sh := range shells(t) {
		t.Run(name, func(t *testing.T) {
			b := newBox(t, sh)
			first := b.run("op-1-bootstrap", append([]string{"--"}, b.counter("hook", `echo out; echo err >&2; exit 3`)...)...)
			again := b.run("op-1-bootstrap", append([]string{"--"}, b.counter("hook", `exit 0`)...)...)
			want := got{State: "exited", Code: 3, Out: "out\nerr\n", Runs: 1}
			for i, r := range []report{first, again} {
				if d := cmp.Diff(want, got{r.state, r.code, string(r.out), b.runs("hook")}); d != "" {
					t.Errorf("report %d (-want +got):\n%s", i, d)
				}
			}
			b.noTemp()
			st, err := os.ReadFile(filepath.Join(b.records, "op-1-bootstrap", "started"))
			if err != nil || !strings.HasPrefix(string(st), "boot-1 ") {
				t.Errorf("started record %q, %v", st, err)
			}
		})
	}
}

// Two wrappers for one key at once: the command runs once; the other
// reports it starting or running, and later its end.
func TestWrapperConcurrentRunsOnce(t *testing.T) {
	for name, sh := range shells(t) {
		t.Run(name, func(t *testing.T) {
			b := newBox(t, sh)
			argv := append([]string{"--"}, b.counter("hook", `sleep 1; echo done`)...)
			var wg sync.WaitGroup
			reports := make([]report, 4)
			for i := range reports {
				wg.Add(1)
				go func() { defer wg.Done(); reports[i] = b.run("k", argv...) }()
			}
			wg.Wait()
			exited := 0
			for _, r := range reports {
				switch r.state {
				case "exited":
					exited++
				case "running", "starting":
				default:
					t.Errorf("report %+v", r)
				}
			}
			if n := b.runs("hook"); n != 1 || exited < 1 {
				t.Errorf("%d runs, %d reports of the end; want 1 run and at least one end", n, exited)
			}
			if r := b.run("k", argv...); r.state != "exited" || string(r.out) != "done\n" {
				t.Errorf("after: %+v", r)
			}
		})
	}
}

// A run that started in an earlier boot and never recorded its end is
// dead: not run again. A claimant that died before starting is lost; a new
// attempt supersedes it and runs, and the old key never runs afterwards.
func TestWrapperDeadAndLost(t *testing.T) {
	for name, sh := range shells(t) {
		t.Run(name, func(t *testing.T) {
			b := newBox(t, sh)
			argv := append([]string{"--"}, b.counter("hook", `exit 0`)...)
			// Started in boot-0 (the guest crashed while it ran).
			if err := os.MkdirAll(filepath.Join(b.records, "a"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(b.records, "a", "started"), []byte("boot-0 4242\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if r := b.run("a", argv...); r.state != "dead" || r.arg != "rebooted" {
				t.Errorf("started in an earlier boot: %+v", r)
			}
			// Started in this boot by a runner that is gone.
			if err := os.WriteFile(filepath.Join(b.records, "a", "started"), []byte("boot-1 999999999\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if r := b.run("a", argv...); r.state != "dead" || r.arg != "999999999" {
				t.Errorf("runner gone: %+v", r)
			}
			// Claimed in this boot by a process that died before starting.
			if err := os.MkdirAll(b.claims, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("999999999", filepath.Join(b.claims, "c")); err != nil {
				t.Fatal(err)
			}
			if r := b.run("c", argv...); r.state != "lost" {
				t.Errorf("dead claimant: %+v", r)
			}
			if n := b.runs("hook"); n != 0 {
				t.Fatalf("%d runs of dead or lost keys", n)
			}
			if r := b.run("c.1", append([]string{"-s", "c"}, argv...)...); r.state != "exited" || b.runs("hook") != 1 {
				t.Errorf("new attempt: %+v, %d runs", r, b.runs("hook"))
			}
			// After a reboot the old claim is gone, but the key stays
			// superseded: it never runs.
			b.boot = "boot-2"
			if err := os.RemoveAll(b.claims); err != nil {
				t.Fatal(err)
			}
			if r := b.run("c", argv...); r.state != "superseded" || b.runs("hook") != 1 {
				t.Errorf("superseded key after a reboot: %+v, %d runs", r, b.runs("hook"))
			}
			b.noTemp()
		})
	}
}

// A runner killed (-9) while its command runs: dead, never run again.
func TestWrapperRunnerKilled(t *testing.T) {
	for name, sh := range shells(t) {
		t.Run(name, func(t *testing.T) {
			b := newBox(t, sh)
			argv := append([]string{"--"}, b.counter("hook", `sleep 30`)...)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			c := b.cmd(ctx, "k", argv...)
			c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }() // the orphaned sleep
			for end := time.Now().Add(10 * time.Second); b.runs("hook") == 0; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(end) {
					t.Fatal("the command never started")
				}
			}
			if r := b.run("k", argv...); r.state != "running" || r.arg != fmt.Sprint(c.Process.Pid) {
				t.Errorf("while it runs: %+v", r)
			}
			_ = c.Process.Kill()
			_ = c.Wait()
			if r := b.run("k", argv...); r.state != "dead" || r.arg != fmt.Sprint(c.Process.Pid) {
				t.Errorf("after kill -9 of the runner %d: %+v", c.Process.Pid, r)
			}
			if n := b.runs("hook"); n != 1 {
				t.Errorf("%d runs", n)
			}
		})
	}
}

// The staged file is moved into place for the command and removed after
// it; a missing staged file claims nothing.
func TestWrapperStagedFile(t *testing.T) {
	for name, sh := range shells(t) {
		t.Run(name, func(t *testing.T) {
			b := newBox(t, sh)
			staged, target := filepath.Join(b.dir, "run/stage/k"), filepath.Join(b.dir, "opt/bigfleet/blob")
			argv := []string{"-b", staged, target, "--", "/bin/sh", "-c", `cat "$0"; stat -c %a "$0"`, target}
			if r := b.run("k", argv...); r.state != "noblob" {
				t.Errorf("nothing staged: %+v", r)
			}
			if err := os.MkdirAll(filepath.Dir(staged), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(staged, []byte("secret\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if r := b.run("k", argv...); r.state != "exited" || r.code != 0 || string(r.out) != "secret\n600\n" {
				t.Errorf("staged: %+v (out %q)", r, r.out)
			}
			for _, p := range []string{staged, target} {
				if _, err := os.Stat(p); !os.IsNotExist(err) {
					t.Errorf("%s after the run: %v", p, err)
				}
			}
			// Staged again (a later leader with the blob): the run reports
			// the recorded end and removes what it no longer needs.
			if err := os.WriteFile(staged, []byte("secret\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if r := b.run("k", argv...); r.state != "exited" || string(r.out) != "secret\n600\n" {
				t.Errorf("again: %+v", r)
			}
			if _, err := os.Stat(staged); !os.IsNotExist(err) {
				t.Errorf("the blob staged again stayed: %v", err)
			}
		})
	}
}

// A repeatable check runs each time, and its output is bounded.
func TestWrapperRepeatAndBoundedOutput(t *testing.T) {
	for name, sh := range shells(t) {
		t.Run(name, func(t *testing.T) {
			b := newBox(t, sh)
			argv := append([]string{"-r", "--"}, b.counter("probe", `i=0; while [ $i -lt 2000 ]; do echo 0123456789; i=$((i+1)); done; exit 1`)...)
			for i := 1; i <= 3; i++ {
				r := b.run("k-ready", argv...)
				if r.state != "exited" || r.code != 1 || len(r.out) != OutputTail || b.runs("probe") != i {
					t.Fatalf("check %d: %s %d, %d bytes of output, %d runs", i, r.state, r.code, len(r.out), b.runs("probe"))
				}
			}
			if _, err := os.Lstat(filepath.Join(b.claims, "k-ready")); !os.IsNotExist(err) {
				t.Errorf("the check's claim stayed: %v", err)
			}
		})
	}
}

// Bad keys and usage are refused before anything is claimed.
func TestWrapperRefusesBadInput(t *testing.T) {
	b := newBox(t, "/bin/sh")
	for _, args := range [][]string{{"../x", "--", "true"}, {"k", "--"}, {"k", "-z", "--", "true"}} {
		c := b.cmd(context.Background(), args[0], args[1:]...)
		if out, err := c.CombinedOutput(); err == nil {
			t.Errorf("%v: accepted (%q)", args, out)
		}
	}
	if _, err := os.Stat(filepath.Join(b.records, "..", "x")); !os.IsNotExist(err) {
		t.Errorf("a bad key reached the disk: %v", err)
	}
}

// Records older than RecordDays are removed when a new command is
// claimed; younger ones stay.
func TestWrapperForgetsOldRecords(t *testing.T) {
	for name, sh := range shells(t) {
		t.Run(name, func(t *testing.T) {
			b := newBox(t, sh)
			b.run("old", "--", "true")
			b.run("young", "--", "true")
			past := time.Now().Add(-(RecordDays + 1) * 24 * time.Hour)
			for _, p := range []string{"old", "old/started", "old/exit", "old/out"} {
				if err := os.Chtimes(filepath.Join(b.records, p), past, past); err != nil {
					t.Fatal(err)
				}
			}
			b.run("new", "--", "true")
			for k, want := range map[string]bool{"old": false, "young": true, "new": true} {
				if _, err := os.Stat(filepath.Join(b.records, k)); (err == nil) != want {
					t.Errorf("record %s present: %v, want %v", k, err == nil, want)
				}
			}
		})
	}
}
