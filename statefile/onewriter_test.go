package statefile

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// pauseAt runs f's compaction until the named step and returns a copy of
// the files there (as a crash at that instant would leave them) and the
// state that copy must recover. At "rotated" it first makes two records
// durable in the next journal.
func pauseAt(t *testing.T, f *File, step string) (string, map[string][]byte) {
	t.Helper()
	steps := make(chan string)
	resume := make(chan struct{})
	testHook = func(s string) {
		if s == "opened-journal" {
			return
		}
		steps <- s
		<-resume
	}
	defer func() { testHook = nil }()
	done := make(chan error, 1)
	go func() { done <- f.compactNow(context.Background()) }()
	var image string
	var want map[string][]byte
	for s := range steps {
		if s == "rotated" {
			mustApply(t, f, put("m/next-1", "in the next journal"))
			mustApply(t, f, put("m/next-2", "in the next journal"), del("m/0"))
		}
		if s == step {
			image, want = copyState(t, f.p.base), f.Snapshot()
		}
		resume <- struct{}{}
		if s == "snapshot-installed" {
			break
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("compact: %v", err)
	}
	if image == "" {
		t.Fatalf("compaction never reached %q", step)
	}
	return image, want
}

// TestSecondWriterWithoutLockFile removes the lock file under a running
// writer: a second Open must still be refused, because the writer holds a
// lock on every journal it may append to.
func TestSecondWriterWithoutLockFile(t *testing.T) {
	for _, step := range []string{"", "next-created", "sealed", "rotated", "snapshot-written", "snapshot-installed"} {
		t.Run("at "+step, func(t *testing.T) {
			path := statePath(t)
			f := mustOpen(t, path, Options{CompactBytes: -1})
			mustApply(t, f, put("m/a", "1"))
			p := pathsFor(path)
			var probing atomic.Bool // the second Open's own hooks pass through
			probe := func() {
				if err := os.Remove(p.lock); err != nil {
					t.Fatal(err)
				}
				probing.Store(true)
				g, err := Open(path, Options{})
				probing.Store(false)
				if err == nil {
					g.Close()
					t.Errorf("a second writer opened the state while the first runs")
				} else if !errors.Is(err, ErrLocked) {
					t.Errorf("second Open = %v, want ErrLocked", err)
				}
			}
			if step == "" {
				probe()
			} else {
				steps := make(chan string)
				resume := make(chan struct{})
				defer func() { testHook = nil }()
				testHook = func(s string) {
					if s == "opened-journal" || probing.Load() {
						return
					}
					steps <- s
					<-resume
				}
				done := make(chan error, 1)
				go func() { done <- f.compactNow(context.Background()) }()
			compaction:
				for {
					select {
					case s := <-steps:
						if s == step {
							probe()
						}
						resume <- struct{}{}
					case err := <-done:
						if err != nil {
							t.Fatalf("compact: %v", err)
						}
						break compaction
					}
				}
				testHook = nil
				probe() // and after the compaction, on the renamed journal
			}
			mustApply(t, f, put("m/b", "2"))
			mustClose(t, f)
			g := mustOpen(t, path, Options{})
			defer mustClose(t, g)
			if diff := cmp.Diff(bytesMap(map[string]string{"m/a": "1", "m/b": "2"}), g.Snapshot(), asStrings); diff != "" {
				t.Errorf("after the writer closed (-want +got):\n%s", diff)
			}
		})
	}
}

// TestJournalLossIsCorruption: a journal that is missing or shorter than
// what other files promise fails Open and ReadOnly with a *CorruptError
// naming it, instead of replaying less (which would, for example, hand out
// operation ids again).
func TestJournalLossIsCorruption(t *testing.T) {
	type image struct {
		path string
		p    paths
	}
	// compacted: records m/0..m/3, a compaction after m/1 during which
	// m/next-1 and m/next-2 went to the new journal (so the snapshot
	// promises them), then m/4.
	compacted := func(t *testing.T) image {
		path := statePath(t)
		f := mustOpen(t, path, Options{CompactBytes: -1})
		for i := range 2 {
			mustApply(t, f, put(fmt.Sprintf("m/%d", i), "v"))
		}
		pauseAt(t, f, "snapshot-installed")
		mustApply(t, f, put("m/4", "v"))
		mustClose(t, f)
		return image{path, pathsFor(path)}
	}
	// midCompaction: the files at a compaction's step, with two records in
	// the next journal.
	midCompaction := func(t *testing.T, step string) image {
		path := statePath(t)
		f := mustOpen(t, path, Options{CompactBytes: -1})
		for i := range 3 {
			mustApply(t, f, put(fmt.Sprintf("m/%d", i), "v"))
		}
		img, _ := pauseAt(t, f, step)
		mustClose(t, f)
		return image{img, pathsFor(img)}
	}
	// uncompacted: a new state with three records and no compaction.
	uncompacted := func(t *testing.T) image {
		path := statePath(t)
		f := mustOpen(t, path, Options{CompactBytes: -1})
		for i := range 3 {
			mustApply(t, f, put(fmt.Sprintf("m/%d", i), "v"))
		}
		mustClose(t, f)
		return image{path, pathsFor(path)}
	}
	truncate := func(t *testing.T, path string, n int64) {
		t.Helper()
		if err := os.Truncate(path, n); err != nil {
			t.Fatal(err)
		}
	}
	remove := func(t *testing.T, path string) {
		t.Helper()
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name     string
		build    func(t *testing.T) image
		damage   func(t *testing.T, im image) (file string, offset int64)
		contains string
		fatal    bool // not even Options.Recover gets past it
	}{
		{
			name:  "journal deleted after a compaction",
			build: compacted,
			damage: func(t *testing.T, im image) (string, int64) {
				remove(t, im.p.journal)
				return im.p.journal, 0
			},
			contains: "the journal of generation 2 is missing",
		},
		{
			name:  "journal deleted before any compaction",
			build: uncompacted,
			damage: func(t *testing.T, im image) (string, int64) {
				remove(t, im.p.journal)
				return im.p.journal, 0
			},
			contains: "the journal of generation 1 is missing",
		},
		{
			name:  "journal truncated to its header",
			build: uncompacted,
			damage: func(t *testing.T, im image) (string, int64) {
				truncate(t, im.p.journal, headerSize)
				return im.p.journal, headerSize
			},
			contains: "records 47 bytes of it as durable",
		},
		{
			name:  "journal truncated to its header after a compaction",
			build: compacted,
			damage: func(t *testing.T, im image) (string, int64) {
				truncate(t, im.p.journal, headerSize)
				return im.p.journal, headerSize
			},
			contains: "as durable: it was truncated",
		},
		{
			name:  "journal cut at a frame the snapshot promised",
			build: compacted,
			damage: func(t *testing.T, im image) (string, int64) {
				offs, _ := frameOffsets(t, im.p.journal)
				truncate(t, im.p.journal, offs[2]) // start frame, m/next-1 | m/next-2
				return im.p.journal, offs[2]
			},
			contains: "as durable: it was truncated",
		},
		{
			name:  "journal cut inside a frame the snapshot promised",
			build: compacted,
			damage: func(t *testing.T, im image) (string, int64) {
				offs, _ := frameOffsets(t, im.p.journal)
				truncate(t, im.p.journal, offs[2]+5)
				return im.p.journal, offs[2] + 5
			},
			contains: "as durable: it was truncated",
		},
		{
			name:  "next journal deleted during a compaction",
			build: func(t *testing.T) image { return midCompaction(t, "rotated") },
			damage: func(t *testing.T, im image) (string, int64) {
				remove(t, im.p.next)
				return im.p.next, 0
			},
			contains: "the journal of generation 2 is missing, but mark",
		},
		{
			name:  "next journal deleted after the snapshot was installed",
			build: func(t *testing.T) image { return midCompaction(t, "snapshot-installed") },
			damage: func(t *testing.T, im image) (string, int64) {
				remove(t, im.p.next)
				return im.p.journal, 0
			},
			contains: "the journal of generation 2 is missing",
		},
		{
			name:  "sealed journal cut while the next one has records",
			build: func(t *testing.T) image { return midCompaction(t, "rotated") },
			damage: func(t *testing.T, im image) (string, int64) {
				offs, _ := frameOffsets(t, im.p.journal)
				cut := offs[len(offs)-2] // drops m/2 and the seal
				truncate(t, im.p.journal, cut)
				return im.p.journal, cut
			},
			contains: "the journal ends unsealed",
			fatal:    true,
		},
		{
			name:  "snapshot promises more than the journal holds",
			build: uncompacted,
			damage: func(t *testing.T, im image) (string, int64) {
				st, err := os.Stat(im.p.journal)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := writeSnapshot(im.p.snap, 1, map[string][]byte{}, st.Size()+1, true); err != nil {
					t.Fatal(err)
				}
				return im.p.journal, st.Size()
			},
			contains: "as durable: it was truncated",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			im := tt.build(t)
			file, offset := tt.damage(t, im)
			before := existing(t, im.path)
			_, openErr := Open(im.path, Options{})
			_, roErr := ReadOnly(im.path)
			for name, err := range map[string]error{"Open": openErr, "ReadOnly": roErr} {
				var ce *CorruptError
				if !errors.As(err, &ce) {
					t.Fatalf("%s = %v, want a *CorruptError", name, err)
				}
				if diff := cmp.Diff(&CorruptError{Path: file, Offset: offset, Recoverable: !tt.fatal}, ce, cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Reason" }, cmp.Ignore())); diff != "" {
					t.Errorf("%s CorruptError (-want +got):\n%s", name, diff)
				}
				if !strings.Contains(err.Error(), tt.contains) {
					t.Errorf("%s error %q does not say %q", name, err, tt.contains)
				}
			}
			// (A crash image has no lock file yet; Open creates it.)
			noLock := cmpopts.IgnoreSliceElements(func(name string) bool { return name == "state.lock" })
			if diff := cmp.Diff(before, existing(t, im.path), noLock); diff != "" {
				t.Errorf("a failed Open changed the files (-before +after):\n%s", diff)
			}
		})
	}
}

// TestCrashCreatingState: a crash between the new state's journal and its
// first snapshot leaves only an empty journal, which is no state yet.
func TestCrashCreatingState(t *testing.T) {
	path := statePath(t)
	var image string
	testHook = func(step string) {
		if step == "created-journal" {
			image = copyState(t, path)
		}
	}
	f := mustOpen(t, path, Options{})
	testHook = nil
	mustClose(t, f)
	if image == "" {
		t.Fatal("creating a state never reached the step between journal and snapshot")
	}
	if diff := cmp.Diff([]string{"state.journal"}, existing(t, image)); diff != "" {
		t.Fatalf("files after the crash (-want +got):\n%s", diff)
	}
	if _, err := ReadOnly(image); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadOnly = %v, want fs.ErrNotExist", err)
	}
	g := mustOpen(t, image, Options{})
	if got := g.Snapshot(); len(got) != 0 {
		t.Errorf("Open recovered %v, want nothing", keys(got))
	}
	mustApply(t, g, put("m/a", "1"))
	mustClose(t, g)
	if diff := cmp.Diff([]string{"state.journal", "state.lock", "state.mark", "state.snap"}, existing(t, image)); diff != "" {
		t.Errorf("files after recovery (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(bytesMap(map[string]string{"m/a": "1"}), reopen(t, image), asStrings); diff != "" {
		t.Errorf("after reopen (-want +got):\n%s", diff)
	}

	// The same journal with a record in it is not a crash while creating.
	withRecord := statePath(t)
	f = mustOpen(t, withRecord, Options{})
	mustApply(t, f, put("m/a", "1"))
	mustClose(t, f)
	if err := os.Remove(pathsFor(withRecord).snap); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(withRecord, Options{}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Open of a journal with records and no snapshot = %v, want ErrCorrupt", err)
	}
}

// TestStatePathNamesAFile: a directory, or a path ending in a separator,
// is not a state path; nothing is created for it.
func TestStatePathNamesAFile(t *testing.T) {
	dir := t.TempDir()
	for _, path := range []string{dir, dir + "/", filepath.Join(dir, "new") + "/"} {
		t.Run(path, func(t *testing.T) {
			if f, err := Open(path, Options{}); err == nil {
				f.Close()
				t.Errorf("Open(%q) succeeded", path)
			}
			if _, err := ReadOnly(path); err == nil || errors.Is(err, fs.ErrNotExist) {
				t.Errorf("ReadOnly(%q) = %v, want an error about the path", path, err)
			}
		})
	}
	if got := existing(t, filepath.Join(dir, "x")); len(got) != 0 {
		t.Errorf("files created in the directory: %v", got)
	}
	if diff := cmp.Diff([]string{filepath.Base(dir)}, existing(t, dir)); diff != "" {
		t.Errorf("files next to the directory (-want +got):\n%s", diff)
	}
}

// TestStatePathIsNoDevice: a device, a FIFO, a path in /dev, a blank or
// dashed name is not a state path; Open and ReadOnly refuse it and write
// nothing (before, /dev/null made Open write its files into /dev).
func TestStatePathIsNoDevice(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ path, want string }{
		{"/dev/null", "character device"},
		{fifo, "named pipe"},
		{"/dev/bigfleet-test-state", "kernel's /dev file system"},
		{"/proc/self/state", "kernel's /proc file system"},
		{"-", "starts with '-'"},
		{" ", "blank"},
		{dir + "/a\nb", "control character"},
	} {
		t.Run(tt.path, func(t *testing.T) {
			if f, err := Open(tt.path, Options{}); err == nil || !strings.Contains(err.Error(), tt.want) {
				if f != nil {
					f.Close()
				}
				t.Errorf("Open(%q) = %v, want an error saying %q", tt.path, err, tt.want)
			}
			if _, err := ReadOnly(tt.path); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ReadOnly(%q) = %v, want an error saying %q", tt.path, err, tt.want)
			}
		})
	}
	for _, base := range []string{"/dev/null", "/dev/bigfleet-test-state"} {
		for _, suffix := range []string{".lock", ".snap", ".journal", ".journal.next", ".mark"} {
			if _, err := os.Stat(base + suffix); err == nil {
				t.Errorf("%s was created", base+suffix)
				os.Remove(base + suffix)
			}
		}
	}
	if diff := cmp.Diff([]string{"fifo"}, existing(t, filepath.Join(dir, "x"))); diff != "" {
		t.Errorf("files in the directory (-want +got):\n%s", diff)
	}
}

// unprivilegedEnv marks a re-executed test binary that dropped root.
const unprivilegedEnv = "STATEFILE_UNPRIVILEGED_OPEN"

// TestUnwritableDirectory: a state directory the process cannot write
// stops Open at once, naming the directory; today's files being writable
// is not enough, since compaction creates new ones.
func TestUnwritableDirectory(t *testing.T) {
	if path := os.Getenv(unprivilegedEnv); path != "" {
		_, err := Open(path, Options{})
		fmt.Printf("open: %v\n", err)
		return
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "state")
	f := mustOpen(t, path, Options{})
	mustApply(t, f, put("m/a", "1"))
	mustClose(t, f)

	var err error
	if os.Geteuid() != 0 {
		if err := os.Chmod(dir, 0o500); err != nil {
			t.Fatal(err)
		}
		defer os.Chmod(dir, 0o700)
		if _, werr := os.Create(filepath.Join(dir, "probe")); werr == nil {
			t.Skip("chmod does not stop this user from writing")
		}
		_, err = Open(path, Options{})
	} else {
		// Root writes anywhere: open as nobody, who owns the files but
		// not the directory.
		const nobody = 65534
		for _, name := range existing(t, path) {
			if err := os.Chown(filepath.Join(dir, name), nobody, nobody); err != nil {
				t.Fatal(err)
			}
		}
		bin := filepath.Join(t.TempDir(), "statefile.test")
		b, rerr := os.ReadFile(os.Args[0])
		if rerr != nil {
			t.Fatal(rerr)
		}
		if err := os.WriteFile(bin, b, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, d := range []string{filepath.Dir(bin), dir, filepath.Dir(dir)} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command(bin, "-test.run=^TestUnwritableDirectory$", "-test.count=1")
		cmd.Env = append(os.Environ(), unprivilegedEnv+"="+path)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		out, cerr := cmd.CombinedOutput()
		if cerr != nil {
			t.Fatalf("unprivileged Open: %v\n%s", cerr, out)
		}
		line, _, _ := strings.Cut(string(out), "\n")
		if line == "open: <nil>" {
			err = nil
		} else {
			err = errors.New(strings.TrimPrefix(line, "open: "))
		}
	}
	if err == nil {
		t.Fatal("Open succeeded in a directory it cannot write")
	}
	if want := "state directory " + dir + " is not writable"; !strings.Contains(err.Error(), want) {
		t.Errorf("Open error %q does not say %q", err, want)
	}
}

// TestErrorsNameTheFile: after a compaction the journal descriptor was
// opened as state.journal.next.tmp; failures must name the file as it is
// called now.
func TestErrorsNameTheFile(t *testing.T) {
	path := statePath(t)
	f := mustOpen(t, path, Options{CompactBytes: -1})
	mustApply(t, f, put("m/a", "1"))
	if err := f.compactNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.journal.Close()
	err := f.Wait(context.Background(), f.Apply(put("m/b", "2")))
	f.Close()
	if want := "append to " + path + ".journal: "; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not contain %q", err, want)
	}
	if err != nil && strings.Contains(err.Error(), ".tmp") {
		t.Errorf("error %q names a temporary file", err)
	}
}

// TestDiskFull fills a small tmpfs: the failure must be ENOSPC and name
// the file the write went to. Needs root to mount.
func TestDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	path := filepath.Join(dir, "state")
	f := mustOpen(t, path, Options{CompactBytes: -1})
	mustApply(t, f, put("m/a", "1"))
	if err := f.compactNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	value := strings.Repeat("x", 16<<10)
	var err error
	for i := 0; err == nil && i < 64; i++ {
		err = f.Wait(context.Background(), f.Apply(put(fmt.Sprintf("m/%d", i), value)))
	}
	f.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("error after filling the disk = %v, want ENOSPC", err)
	}
	if want := "append to " + path + ".journal: "; !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), ".tmp") {
		t.Errorf("error %q does not name the journal as %q", err, want)
	}
}

// TestLostFilesStopTheWriter (issue 17, item 6d): once every file of the
// state is deleted under a running writer, a second writer can open a new
// state there; the first must stop instead of acknowledging records into
// files nobody will read: the next commit fails with ErrLost, and so does
// an idle writer, found by its watch.
func TestLostFilesStopTheWriter(t *testing.T) {
	removeAll := func(t *testing.T, path string) {
		p := pathsFor(path)
		for _, f := range []string{p.lock, p.snap, p.journal, p.next} {
			if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Fatal(err)
			}
		}
	}
	t.Run("commit", func(t *testing.T) {
		path := statePath(t)
		f := mustOpen(t, path, Options{})
		mustApply(t, f, put("m/a", "1"))
		removeAll(t, path)
		second := mustOpen(t, path, Options{}) // nothing keeps it out now
		defer mustClose(t, second)
		seq := f.Apply(put("m/b", "2"))
		if err := f.Wait(context.Background(), seq); !errors.Is(err, ErrLost) {
			t.Errorf("commit after the files were deleted: %v, want ErrLost", err)
		}
		done := make(chan error, 1)
		f.Commit([]Op{put("m/c", "3")}, func(err error) { done <- err })
		if err := <-done; !errors.Is(err, ErrLost) {
			t.Errorf("later commit: %v, want ErrLost", err)
		}
		waitStopped(t, f)
		if err := f.Healthy(); !errors.Is(err, ErrLost) {
			t.Errorf("Healthy = %v, want ErrLost", err)
		}
		f.Close()
		if got := second.Snapshot(); len(got) != 0 {
			t.Errorf("the second writer's state holds %v", got)
		}
	})
	t.Run("idle", func(t *testing.T) {
		path := statePath(t)
		f := mustOpen(t, path, Options{})
		mustApply(t, f, put("m/a", "1"))
		removeAll(t, path)
		waitStopped(t, f) // the watch finds it without a commit
		if err := f.Healthy(); !errors.Is(err, ErrLost) || !strings.Contains(err.Error(), path+".journal") {
			t.Errorf("Healthy = %v, want ErrLost naming the journal", err)
		}
		f.Close()
	})
	t.Run("journal replaced", func(t *testing.T) {
		path := statePath(t)
		f := mustOpen(t, path, Options{})
		mustApply(t, f, put("m/a", "1"))
		p := pathsFor(path)
		other := statePath(t)
		g := mustOpen(t, other, Options{})
		mustClose(t, g)
		if err := os.Rename(pathsFor(other).journal, p.journal); err != nil {
			t.Fatal(err)
		}
		seq := f.Apply(put("m/b", "2"))
		if err := f.Wait(context.Background(), seq); !errors.Is(err, ErrLost) {
			t.Errorf("commit after the journal was replaced: %v, want ErrLost", err)
		}
		f.Close()
	})
}

// waitStopped waits for f to stop; the bound only keeps a broken watch
// from hanging the suite.
func waitStopped(t *testing.T, f *File) {
	t.Helper()
	select {
	case <-f.Stopped():
	case <-time.After(time.Minute):
		t.Fatal("the File never stopped")
	}
}
