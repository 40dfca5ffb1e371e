package statefile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// goid returns the calling goroutine's id, to tell a callback run inside
// Commit from one run elsewhere.
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, err := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	if err != nil {
		panic(err)
	}
	return id
}

// callbackLog checks the callback contract as callbacks arrive: each
// exactly once, in commit order, one at a time, never on the goroutine
// that called Commit.
type callbackLog struct {
	t       testing.TB
	running atomic.Bool
	mu      sync.Mutex
	next    int // the commit number the next callback must carry
	errs    []error
	callers map[int]uint64 // commit number -> goroutine that called Commit
	ran     chan struct{}  // gets a value per callback
}

func newCallbackLog(t testing.TB) *callbackLog {
	return &callbackLog{t: t, callers: map[int]uint64{}, ran: make(chan struct{}, 1<<16)}
}

// commit calls s.Commit as commit number n; callers serialise calls so
// that n is the commit order.
func (l *callbackLog) commit(s Store, n int, ops []Op) {
	l.mu.Lock()
	l.callers[n] = goid()
	l.mu.Unlock()
	s.Commit(ops, func(err error) {
		if !l.running.CompareAndSwap(false, true) {
			l.t.Errorf("callback %d runs while another one does", n)
		}
		defer l.running.Store(false)
		me := goid()
		l.mu.Lock()
		if l.callers[n] == me {
			l.t.Errorf("callback %d ran on the goroutine that called Commit", n)
		}
		if n != l.next {
			l.t.Errorf("callback for commit %d, want commit %d next", n, l.next)
		}
		l.next = n + 1
		l.errs = append(l.errs, err)
		l.mu.Unlock()
		l.ran <- struct{}{}
	})
}

// await waits for n more callbacks.
func (l *callbackLog) await(n int) {
	l.t.Helper()
	for range n {
		select {
		case <-l.ran:
		case <-time.After(30 * time.Second):
			l.t.Fatalf("a callback never came (after %d)", l.next)
		}
	}
}

func (l *callbackLog) results() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]error(nil), l.errs...)
}

// noneMore fails if a callback arrives beyond the expected ones; after
// Close nothing may still be pending.
func (l *callbackLog) noneMore() {
	l.t.Helper()
	select {
	case <-l.ran:
		l.t.Errorf("an extra callback ran")
	default:
	}
}

// stores opens each implementation of the Commit contract.
var stores = []struct {
	name string
	open func(t *testing.T, opts Options) Store
}{
	{"File", func(t *testing.T, opts Options) Store { return mustOpen(t, statePath(t), opts) }},
	{"Memory", func(t *testing.T, _ Options) Store { return NewMemory(nil) }},
}

func TestCommitCallbacks(t *testing.T) {
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			s := st.open(t, Options{CompactBytes: 8 << 10})
			l := newCallbackLog(t)
			const clients, each = 8, 150
			var order sync.Mutex // makes the commit number the Commit order
			n := 0
			var wg sync.WaitGroup
			for c := range clients {
				wg.Go(func() {
					for i := range each {
						ops := []Op{put(fmt.Sprintf("m/%d/%d", c, i%20), strings.Repeat("v", 100)), put(fmt.Sprintf("c/%d", c), strconv.Itoa(i))}
						if i%5 == 4 {
							ops = nil // a barrier
						}
						order.Lock()
						l.commit(s, n, ops)
						n++
						order.Unlock()
					}
				})
			}
			wg.Wait()
			l.await(clients * each)
			for i, err := range l.results() {
				if err != nil {
					t.Fatalf("callback %d: %v", i, err)
				}
			}
			want := s.Snapshot()
			mustClose(t, s)
			l.noneMore()
			if f, ok := s.(*File); ok {
				if diff := cmp.Diff(want, reopen(t, f.p.base), asStrings); diff != "" {
					t.Errorf("after reopen (-want +got):\n%s", diff)
				}
			}
			for c := range clients {
				if got, want := string(want[fmt.Sprintf("c/%d", c)]), strconv.Itoa(each-2); got != want {
					t.Errorf("c/%d = %q, want %q", c, got, want)
				}
			}
		})
	}
}

// TestCommitCallbackRunsAfterFsync holds the marker after one group
// commit and checks that callbacks of records it has not recorded yet
// wait.
func TestCommitCallbackRunsAfterFsync(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	f := mustOpen(t, statePath(t), Options{OnCommit: func(int, int, time.Duration) {
		once.Do(func() { <-release })
	}})
	l := newCallbackLog(t)
	l.commit(f, 0, []Op{put("m/a", "1")})
	l.await(1) // runs before OnCommit, which now holds the marker
	l.commit(f, 1, []Op{put("m/b", "2")})
	l.commit(f, 2, nil)
	if got := string(f.Snapshot()["m/b"]); got != "2" {
		t.Errorf("Snapshot after Commit: m/b = %q, want it visible at once", got)
	}
	select {
	case <-l.ran:
		t.Fatal("a callback ran before its record was written")
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	l.await(2)
	if diff := cmp.Diff([]error{nil, nil, nil}, l.results(), cmpErrors); diff != "" {
		t.Errorf("callback errors (-want +got):\n%s", diff)
	}
	mustClose(t, f)
}

// cmpErrors compares errors by message.
var cmpErrors = cmp.Comparer(func(a, b error) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Error() == b.Error()
})

func TestCommitFailureIsSticky(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	path := statePath(t)
	f := mustOpen(t, path, Options{OnCommit: func(int, int, time.Duration) {
		once.Do(func() { <-release })
	}})
	l := newCallbackLog(t)
	l.commit(f, 0, []Op{put("m/a", "1")})
	l.await(1)
	// The marker is held (OnCommit); the committer is idle, and its next
	// write fails.
	f.journal.Close()
	l.commit(f, 1, []Op{put("m/b", "2")})
	l.commit(f, 2, []Op{put("m/c", "3")})
	l.commit(f, 3, nil)
	close(release)
	l.await(3)
	errs := l.results()
	failure := f.Healthy()
	if failure == nil {
		t.Fatal("Healthy = nil after a failed write")
	}
	l.commit(f, 4, []Op{put("m/d", "4")})
	l.commit(f, 5, nil)
	l.await(2)
	if err := mustCloseErr(f); err == nil || !strings.Contains(err.Error(), failure.Error()) {
		t.Errorf("Close = %v, want it to report %v", err, failure)
	}
	l.commit(f, 6, []Op{put("m/e", "5")}) // after Close: still the failure
	l.await(1)
	l.noneMore()
	want := []error{nil, failure, failure, failure, failure, failure, failure}
	if diff := cmp.Diff(want, l.results(), cmpErrors); diff != "" {
		t.Errorf("callback errors (-want +got):\n%s", diff)
	}
	if !strings.Contains(errs[1].Error(), "append to "+path+".journal: ") {
		t.Errorf("failure %q does not name the journal", errs[1])
	}
	if _, err := f.Load(context.Background()); err == nil || err.Error() != "load state: "+failure.Error() {
		t.Errorf("Load after the failure = %v, want %v", err, failure)
	}
	if diff := cmp.Diff(bytesMap(map[string]string{"m/a": "1"}), reopen(t, path), asStrings); diff != "" {
		t.Errorf("after reopen (-want +got):\n%s", diff)
	}
}

func mustCloseErr(s Store) error { return s.Close() }

// TestCommitOversizedRecordStopsTheStore: a later record may depend on the
// one refused, so nothing after it may be written either.
func TestCommitOversizedRecordStopsTheStore(t *testing.T) {
	huge := make([]byte, maxRecord+1) // never touched: no real memory
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			s := st.open(t, Options{})
			l := newCallbackLog(t)
			l.commit(s, 0, []Op{put("m/a", "1")})
			l.commit(s, 1, []Op{{Key: "m/huge", Value: huge}})
			l.commit(s, 2, []Op{put("m/b", "2")})
			l.await(3)
			errs := l.results()
			if errs[0] != nil && st.name == "Memory" {
				t.Errorf("callback 0 = %v, want nil", errs[0])
			}
			failure := s.Healthy()
			if failure == nil || !strings.Contains(failure.Error(), "limit") {
				t.Fatalf("Healthy = %v, want the size-limit failure", failure)
			}
			if diff := cmp.Diff([]error{failure, failure}, errs[1:], cmpErrors); diff != "" {
				t.Errorf("callback errors (-want +got):\n%s", diff)
			}
			if got := s.Snapshot(); got["m/huge"] != nil || got["m/b"] != nil {
				t.Errorf("Snapshot holds records after the refused one: %v", keys(got))
			}
			s.Close()
			if f, ok := s.(*File); ok {
				got := reopen(t, f.p.base)
				if got["m/huge"] != nil || got["m/b"] != nil {
					t.Errorf("records after the refused one were written: %v", keys(got))
				}
			}
		})
	}
}

func keys(m map[string][]byte) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

func TestCommitAndClose(t *testing.T) {
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			s := st.open(t, Options{})
			l := newCallbackLog(t)
			const n = 200
			for i := range n {
				l.commit(s, i, []Op{put(fmt.Sprintf("m/%d", i), "v")})
			}
			mustClose(t, s)
			// Close returns only once every earlier callback has run.
			if got := len(l.results()); got != n {
				t.Fatalf("%d callbacks ran before Close returned, want %d", got, n)
			}
			l.commit(s, n, []Op{put("m/late", "v")})
			l.commit(s, n+1, nil)
			l.await(n + 2)
			want := make([]error, n, n+2)
			want = append(want, ErrClosed, ErrClosed)
			if diff := cmp.Diff(want, l.results(), cmpErrors); diff != "" {
				t.Errorf("callback errors (-want +got):\n%s", diff)
			}
			if _, err := s.Load(context.Background()); !errors.Is(err, ErrClosed) {
				t.Errorf("Load after Close = %v, want ErrClosed", err)
			}
			if _, ok := s.Snapshot()["m/late"]; ok {
				t.Errorf("a Commit after Close was applied")
			}
			if err := s.Healthy(); !errors.Is(err, ErrClosed) {
				t.Errorf("Healthy after Close = %v, want ErrClosed", err)
			}
		})
	}
}

// TestCommitDuringClose races Commits with Close: every callback still
// runs exactly once, in order, and the records acknowledged with nil are
// exactly those that survive.
func TestCommitDuringClose(t *testing.T) {
	path := statePath(t)
	f := mustOpen(t, path, Options{})
	l := newCallbackLog(t)
	const n = 300
	closed := make(chan error)
	for i := range n {
		if i == n/2 {
			go func() { closed <- f.Close() }()
		}
		l.commit(f, i, []Op{put(fmt.Sprintf("m/%d", i), "v")})
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	l.await(n)
	got := reopen(t, path)
	for i, err := range l.results() {
		_, kept := got[fmt.Sprintf("m/%d", i)]
		switch {
		case err == nil && !kept:
			t.Errorf("commit %d was acknowledged but is lost", i)
		case err != nil && !errors.Is(err, ErrClosed):
			t.Errorf("commit %d: %v, want nil or ErrClosed", i, err)
		case err != nil && kept:
			t.Errorf("commit %d failed with %v but was written", i, err)
		}
	}
}

func TestLoad(t *testing.T) {
	path := statePath(t)
	f := mustOpen(t, path, Options{})
	mustApply(t, f, put("m/a", "1"), put("m/b", "2"))
	mustClose(t, f)

	release := make(chan struct{})
	var once sync.Once
	f = mustOpen(t, path, Options{OnCommit: func(int, int, time.Duration) {
		once.Do(func() { <-release })
	}})
	defer mustClose(t, f)
	got, err := f.Load(context.Background())
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if diff := cmp.Diff(bytesMap(map[string]string{"m/a": "1", "m/b": "2"}), got, asStrings); diff != "" {
		t.Errorf("Load (-want +got):\n%s", diff)
	}
	// Load reports what is committed: it waits for queued batches.
	first := make(chan error, 1)
	f.Commit([]Op{del("m/a")}, func(err error) { first <- err })
	if err := <-first; err != nil { // the marker now waits in OnCommit
		t.Fatal(err)
	}
	f.Commit([]Op{put("m/c", "3")}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := f.Load(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Load while its batch is unwritten = %v, want DeadlineExceeded", err)
	}
	close(release)
	got, err = f.Load(context.Background())
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if diff := cmp.Diff(bytesMap(map[string]string{"m/b": "2", "m/c": "3"}), got, asStrings); diff != "" {
		t.Errorf("Load after commits (-want +got):\n%s", diff)
	}

	m := NewMemory(map[string][]byte{"m/a": []byte("1")})
	m.Commit([]Op{put("m/b", "2")}, nil)
	got, err = m.Load(context.Background())
	if err != nil {
		t.Fatalf("Memory Load: %v", err)
	}
	if diff := cmp.Diff(bytesMap(map[string]string{"m/a": "1", "m/b": "2"}), got, asStrings); diff != "" {
		t.Errorf("Memory Load (-want +got):\n%s", diff)
	}
	mustClose(t, m)
}

// TestCallbackMayCommit: a callback may Commit again; its own
// callback follows, never inside the first.
func TestCallbackMayCommit(t *testing.T) {
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			s := st.open(t, Options{})
			var depth atomic.Int32
			done := make(chan int, 10)
			var chain func(i int) func(error)
			chain = func(i int) func(error) {
				return func(err error) {
					if d := depth.Add(1); d != 1 {
						t.Errorf("callback %d nested %d deep", i, d)
					}
					defer depth.Add(-1)
					if err != nil {
						t.Errorf("callback %d: %v", i, err)
					}
					if i < 5 {
						s.Commit([]Op{put(fmt.Sprintf("m/%d", i+1), "v")}, chain(i+1))
					}
					done <- i
				}
			}
			s.Commit([]Op{put("m/0", "v")}, chain(0))
			for want := range 6 {
				select {
				case got := <-done:
					if got != want {
						t.Errorf("callback %d, want %d", got, want)
					}
				case <-time.After(30 * time.Second):
					t.Fatalf("callback %d never came", want)
				}
			}
			mustClose(t, s)
		})
	}
}
