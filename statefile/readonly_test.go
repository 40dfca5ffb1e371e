package statefile

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/retry"
)

// TestReadOnlyWhileWriting reads the state without the lock while a writer
// appends and compacts every few KiB. Every read must be a consistent cut
// that includes everything acknowledged before the read began.
func TestReadOnlyWhileWriting(t *testing.T) {
	const slots = 200
	pad := strings.Repeat(" ", 200) // a state of ~40 KiB makes reads overlap compactions
	path := statePath(t)
	// Durability is not under test here, interleaving is: skip fsync so the
	// writer outpaces the readers.
	f := mustOpen(t, path, Options{CompactBytes: 16 << 10, NoSync: true})
	mustApply(t, f, put("meta/last", "-1"))
	var acked atomic.Int64
	acked.Store(-1)
	done := make(chan struct{})
	var reads atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(done)
		// Record i sets slot i%slots to i and meta/last to i, atomically.
		// Write until the readers have had plenty of chances to race a
		// compaction.
		for i := 0; i < 100000 && (i < 1000 || reads.Load() < 150); i++ {
			seq := f.Apply(put(fmt.Sprintf("m/%d", i%slots), strconv.Itoa(i)+pad), put("meta/last", strconv.Itoa(i)))
			if err := f.Wait(context.Background(), seq); err != nil {
				t.Errorf("Wait: %v", err)
				return
			}
			acked.Store(int64(i))
		}
	})
	for r := range 2 {
		wg.Go(func() {
			prev := -1
			for {
				select {
				case <-done:
					return
				default:
				}
				floor := int(acked.Load())
				s, err := ReadOnly(path)
				if err != nil {
					t.Errorf("reader %d: %v", r, err)
					return
				}
				reads.Add(1)
				last, err := strconv.Atoi(string(s["meta/last"]))
				if err != nil {
					t.Errorf("reader %d: meta/last = %q", r, s["meta/last"])
					return
				}
				if last < floor || last < prev {
					t.Errorf("reader %d: read meta/last %d, but %d was acknowledged before the read and %d read earlier", r, last, floor, prev)
				}
				prev = last
				if want := min(last+1, slots) + 1; len(s) != want {
					t.Errorf("reader %d: %d keys at meta/last %d, want %d", r, len(s), last, want)
				}
				for i := max(0, last-slots+1); i <= last; i++ {
					if got := string(s[fmt.Sprintf("m/%d", i%slots)]); got != strconv.Itoa(i)+pad {
						t.Errorf("reader %d: m/%d = %q at meta/last %d, want %d: not a consistent cut", r, i%slots, got, last, i)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	f.mu.Lock()
	gen := f.snapGen
	f.mu.Unlock()
	mustClose(t, f)
	if gen < 5 {
		t.Errorf("only %d snapshot generations: the readers did not race compactions", gen)
	}
	t.Logf("%d consistent reads across %d generations", reads.Load(), gen)
}

// TestReadOnlyNoticesReplacedFiles pins the check ReadOnly's consistency
// rests on: files opened before a compaction no longer match the paths.
func TestReadOnlyNoticesReplacedFiles(t *testing.T) {
	path := statePath(t)
	f := mustOpen(t, path, Options{CompactBytes: -1})
	mustApply(t, f, put("m/a", "1"))
	p := pathsFor(path)
	tests := []struct {
		name   string
		change func(t *testing.T)
		want   bool
	}{
		{"appends only", func(t *testing.T) { mustApply(t, f, put("m/b", "2")) }, true},
		{"compaction", func(t *testing.T) {
			if err := f.compactNow(context.Background()); err != nil {
				t.Fatal(err)
			}
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := openAll(p)
			if err != nil {
				t.Fatal(err)
			}
			defer o.close()
			tt.change(t)
			got, err := o.unchanged(p)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("unchanged = %v, want %v", got, tt.want)
			}
		})
	}
	mustClose(t, f)
}

// TestReadOnlyRacingCompaction stops ReadOnly between opening the journal
// and the next journal, and lets a compaction finish there: without the
// replaced-file check it would return the new snapshot without the
// records acknowledged in the next journal.
func TestReadOnlyRacingCompaction(t *testing.T) {
	path := statePath(t)
	f := mustOpen(t, path, Options{CompactBytes: -1})
	mustApply(t, f, put("m/a", "1"))

	type stop struct {
		step   string
		resume chan struct{}
	}
	stops := make(chan stop)
	var passThrough atomic.Bool
	testHook = func(step string) {
		if passThrough.Load() {
			return
		}
		s := stop{step, make(chan struct{})}
		stops <- s
		<-s.resume
	}
	defer func() { testHook = nil }()
	expect := func(step string) stop {
		t.Helper()
		s := <-stops
		if s.step != step {
			t.Fatalf("stopped at %q, want %q", s.step, step)
		}
		return s
	}

	compacted := make(chan error, 1)
	go func() { compacted <- f.compactNow(context.Background()) }()
	close(expect("next-created").resume)
	close(expect("sealed").resume)
	s := expect("rotated")
	mustApply(t, f, put("m/b", "acked in the next journal"))
	close(s.resume)
	close(expect("snapshot-written").resume)
	installed := expect("snapshot-installed")

	type result struct {
		state map[string][]byte
		err   error
	}
	read := make(chan result, 1)
	go func() {
		s, err := ReadOnly(path)
		read <- result{s, err}
	}()
	reader := expect("opened-journal")
	passThrough.Store(true)
	close(installed.resume)
	if err := <-compacted; err != nil {
		t.Fatalf("compact: %v", err)
	}
	close(reader.resume)
	got := <-read
	if got.err != nil {
		t.Fatalf("ReadOnly: %v", got.err)
	}
	want := bytesMap(map[string]string{"m/a": "1", "m/b": "acked in the next journal"})
	if diff := cmp.Diff(want, got.state, asStrings); diff != "" {
		t.Errorf("ReadOnly (-want +got):\n%s", diff)
	}
	mustClose(t, f)
}

// TestReadOnlyBoundedByItsPolicy: files replaced under every read (a
// compaction each time) make ReadOnly give up after exactly
// retry.StateRead's attempts, not loop.
func TestReadOnlyBoundedByItsPolicy(t *testing.T) {
	old := readOnlyPolicy
	readOnlyPolicy.Initial, readOnlyPolicy.Max = time.Nanosecond, time.Nanosecond
	defer func() { readOnlyPolicy = old }()
	path := statePath(t)
	f := mustOpen(t, path, Options{CompactBytes: -1})
	mustApply(t, f, put("m/a", "1"))
	reads := 0
	testHook = func(step string) {
		if step != "opened-journal" {
			return
		}
		reads++
		mustApply(t, f, put("m/a", fmt.Sprint(reads)))
		if err := f.compactNow(context.Background()); err != nil {
			t.Errorf("compact: %v", err)
		}
	}
	_, err := ReadOnly(path)
	testHook = nil
	want := retry.StateRead.Attempts
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("gave up after %d attempts: files were replaced", want)) {
		t.Errorf("ReadOnly = %v, want it to give up after %d attempts", err, want)
	}
	if reads != want {
		t.Errorf("ReadOnly read %d times, want %d (retry.StateRead.Attempts)", reads, want)
	}
	mustClose(t, f)
}
