package statefile

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// checkRecovers opens a crash image and expects want, both through
// ReadOnly on the untouched files and through Open, and then expects Open
// to have left a clean set of files that reopens to the same state.
func checkRecovers(t *testing.T, image string, want map[string][]byte) {
	t.Helper()
	got, err := ReadOnly(image)
	if err != nil {
		t.Fatalf("ReadOnly: %v", err)
	}
	if diff := cmp.Diff(want, got, asStrings); diff != "" {
		t.Errorf("ReadOnly (-want +got):\n%s", diff)
	}
	f := mustOpen(t, image, Options{})
	if diff := cmp.Diff(want, f.Snapshot(), asStrings); diff != "" {
		t.Errorf("Open (-want +got):\n%s", diff)
	}
	mustApply(t, f, put("m/after-recovery", "1"))
	mustClose(t, f)
	if diff := cmp.Diff([]string{"state.journal", "state.lock", "state.mark", "state.snap"}, existing(t, image)); diff != "" {
		t.Errorf("files after recovery (-want +got):\n%s", diff)
	}
	want = maps2(want, "m/after-recovery", "1")
	if diff := cmp.Diff(want, reopen(t, image), asStrings); diff != "" {
		t.Errorf("second reopen (-want +got):\n%s", diff)
	}
}

func maps2(m map[string][]byte, k, v string) map[string][]byte {
	out := make(map[string][]byte, len(m)+1)
	for k, v := range m {
		out[k] = v
	}
	out[k] = []byte(v)
	return out
}

// TestCrashDuringCompaction copies the files at every step of a real
// compaction (and of the rewrite Open does to finish one), as kill -9 or
// power loss at that instant would leave them, and recovers each copy.
func TestCrashDuringCompaction(t *testing.T) {
	path := statePath(t)
	f := mustOpen(t, path, Options{CompactBytes: -1})
	for i := range 20 {
		mustApply(t, f, put(fmt.Sprintf("m/%d", i), fmt.Sprintf(`{"i":%d}`, i)))
	}
	mustApply(t, f, del("m/3"), put("m/4", "overwritten"))

	type image struct {
		path string
		want map[string][]byte
	}
	images := map[string]image{}
	steps := make(chan string)
	resume := make(chan struct{})
	testHook = func(step string) {
		if step == "opened-journal" {
			return
		}
		steps <- step
		<-resume
	}
	defer func() { testHook = nil }()
	done := make(chan error, 1)
	go func() { done <- f.compactNow(context.Background()) }()
	for _, want := range []string{"next-created", "sealed", "rotated", "snapshot-written", "snapshot-installed"} {
		step := <-steps
		if step != want {
			t.Fatalf("compaction step %q, want %q", step, want)
		}
		if step == "rotated" {
			// The committer now appends to the next journal; make records
			// durable there while the snapshot is still unwritten.
			mustApply(t, f, put("m/during", "1"), del("m/0"))
			mustApply(t, f, put("m/5", "during"))
		}
		images[step] = image{copyState(t, path), f.Snapshot()}
		resume <- struct{}{}
	}
	if err := <-done; err != nil {
		t.Fatalf("compact: %v", err)
	}
	testHook = nil
	images["compacted"] = image{copyState(t, path), f.Snapshot()}
	mustApply(t, f, put("m/last", "1"))
	mustClose(t, f)
	images["closed"] = image{copyState(t, path), reopen(t, path)}

	// Open must finish a compaction interrupted before its snapshot was
	// installed; crash that too.
	rewriting := copyState(t, images["rotated"].path)
	testHook = func(step string) {
		if step == "finish-snapshot-installed" {
			images["finish: snapshot-installed"] = image{copyState(t, rewriting), images["rotated"].want}
		}
	}
	g := mustOpen(t, rewriting, Options{})
	testHook = nil
	mustClose(t, g)

	// A torn tail in the journal a compaction switched to.
	for _, step := range []string{"rotated", "snapshot-installed"} {
		torn := copyState(t, images[step].path)
		fh, err := os.OpenFile(pathsFor(torn).next, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		fh.Write([]byte{40, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
		fh.Close()
		images[step+" + torn next"] = image{torn, images[step].want}
	}

	if _, ok := images["finish: snapshot-installed"]; !ok {
		t.Fatal("Open did not finish the compaction left by a crash before the snapshot was written")
	}
	// The copies must show the crash states the protocol passes through.
	wantFiles := map[string][]string{
		"next-created":               {"state.journal", "state.journal.next", "state.mark", "state.snap"},
		"sealed":                     {"state.journal", "state.journal.next", "state.mark", "state.snap"},
		"rotated":                    {"state.journal", "state.journal.next", "state.mark", "state.snap"},
		"finish: snapshot-installed": {"state.journal", "state.journal.next", "state.mark", "state.snap"},
		"snapshot-written":           {"state.journal", "state.journal.next", "state.mark", "state.snap", "state.snap.tmp"},
		"snapshot-installed":         {"state.journal", "state.journal.next", "state.mark", "state.snap"},
		"compacted":                  {"state.journal", "state.mark", "state.snap"},
	}
	for step, want := range wantFiles {
		if diff := cmp.Diff(want, existing(t, images[step].path)); diff != "" {
			t.Errorf("files at %s (-want +got):\n%s", step, diff)
		}
	}
	for name, im := range images {
		t.Run(name, func(t *testing.T) { checkRecovers(t, im.path, im.want) })
	}
}

func TestLeftoverTempFiles(t *testing.T) {
	path := statePath(t)
	f := mustOpen(t, path, Options{})
	mustApply(t, f, put("m/a", "1"))
	mustClose(t, f)
	p := pathsFor(path)
	for _, tmp := range p.temps() {
		if err := os.WriteFile(tmp, []byte("half-written"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	checkRecovers(t, path, bytesMap(map[string]string{"m/a": "1"}))
}

func TestCrashBeforeFirstSnapshot(t *testing.T) {
	// Open of a new state crashed after writing the snapshot's temp file.
	path := statePath(t)
	if err := os.WriteFile(pathsFor(path).snap+".tmp", []byte("BFSTATE"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadOnly(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadOnly = %v, want fs.ErrNotExist: a temp file is not a state", err)
	}
	f := mustOpen(t, path, Options{})
	if got := f.Snapshot(); len(got) != 0 {
		t.Errorf("Snapshot = %v, want empty", got)
	}
	mustClose(t, f)
	if diff := cmp.Diff([]string{"state.journal", "state.lock", "state.mark", "state.snap"}, existing(t, path)); diff != "" {
		t.Errorf("files (-want +got):\n%s", diff)
	}
}

const crashChildEnv = "STATEFILE_CRASH_CHILD"

const crashWriters = 6

// crashValue is what writer w stores for its i-th record.
func crashValue(w, i int) string {
	return fmt.Sprintf(`{"writer":%d,"i":%d,"pad":"%s"}`, w, i, strings.Repeat("v", 60))
}

// crashState is the state after writer w's records 0..last[w] (-1: none):
// each record puts k/w/i and c/w, and deletes k/w/(i-5).
func crashState(last []int) map[string][]byte {
	m := map[string][]byte{}
	for w, c := range last {
		if c < 0 {
			continue
		}
		m[fmt.Sprintf("c/%d", w)] = []byte(strconv.Itoa(c))
		for i := max(0, c-4); i <= c; i++ {
			m[fmt.Sprintf("k/%d/%d", w, i)] = []byte(crashValue(w, i))
		}
	}
	return m
}

// crashChild runs in a re-executed test binary: it appends records from
// several writers and prints every acknowledged one until it is killed.
func crashChild(path string) {
	time.AfterFunc(20*time.Second, func() { os.Exit(3) }) // orphan guard
	f, err := Open(path, Options{CompactBytes: 16 << 10})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	start := f.Snapshot()
	var out sync.Mutex
	var wg sync.WaitGroup
	for w := range crashWriters {
		wg.Go(func() {
			i := 0
			if c, ok := start[fmt.Sprintf("c/%d", w)]; ok {
				n, _ := strconv.Atoi(string(c))
				i = n + 1
			}
			for ; ; i++ {
				seq := f.Apply(
					put(fmt.Sprintf("k/%d/%d", w, i), crashValue(w, i)),
					del(fmt.Sprintf("k/%d/%d", w, i-5)),
					put(fmt.Sprintf("c/%d", w), strconv.Itoa(i)),
				)
				if err := f.Wait(context.Background(), seq); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(2)
				}
				out.Lock()
				fmt.Fprintf(os.Stdout, "ack %d %d\n", w, i)
				out.Unlock()
			}
		})
	}
	wg.Wait()
}

// TestKill9 re-executes the test binary as a writer, SIGKILLs it at a
// random moment (often mid-commit or mid-compaction), and checks that
// every record it acknowledged survived, and that nothing was applied
// partially or out of order.
func TestKill9(t *testing.T) {
	if path := os.Getenv(crashChildEnv); path != "" {
		crashChild(path)
		return
	}
	path := statePath(t)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("seed %d", seed)
	acked := make([]int, crashWriters)
	for w := range acked {
		acked[w] = -1
	}
	total := 0
	for round := range 6 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKill9$", "-test.count=1")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+path)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 1024)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		// Let the child get past Open and commit for a random while.
		var first string
		select {
		case first = <-lines:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("round %d: child acknowledged nothing; stderr: %s", round, stderr.String())
		}
		time.Sleep(time.Duration(rng.IntN(200)) * time.Millisecond)
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		n := 0
		record := func(line string) {
			var w, i int
			if _, err := fmt.Sscanf(line, "ack %d %d", &w, &i); err != nil {
				t.Fatalf("round %d: child printed %q", round, line)
			}
			acked[w] = max(acked[w], i)
			n++
		}
		record(first)
		for line := range lines {
			record(line)
		}
		cmd.Wait()
		total += n

		got, err := ReadOnly(path)
		if err != nil {
			t.Fatalf("round %d: ReadOnly after kill: %v", round, err)
		}
		f := mustOpen(t, path, Options{})
		state := f.Snapshot()
		mustClose(t, f)
		if diff := cmp.Diff(state, got, asStrings); diff != "" {
			t.Errorf("round %d: ReadOnly and Open disagree (-open +readonly):\n%s", round, diff)
		}
		last := make([]int, crashWriters)
		for w := range last {
			last[w] = -1
			if c, ok := state[fmt.Sprintf("c/%d", w)]; ok {
				last[w], _ = strconv.Atoi(string(c))
			}
			if last[w] < acked[w] {
				t.Errorf("round %d: writer %d: record %d was acknowledged but only %d survived", round, w, acked[w], last[w])
			}
		}
		if diff := cmp.Diff(crashState(last), state, asStrings); diff != "" {
			t.Fatalf("round %d: recovered state is not a prefix of each writer's records (-want +got):\n%s", round, diff)
		}
	}
	t.Logf("%d acknowledged records checked across 6 kills", total)
}
