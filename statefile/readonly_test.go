package statefile

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
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
		for i := 0; i < 100000 && (i < 1000 || reads.Load() < 200); i++ {
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
