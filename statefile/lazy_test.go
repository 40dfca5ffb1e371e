package statefile

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// commitCounter is an OnCommit that records every group commit's record
// count and signals each one.
type commitCounter struct {
	mu     sync.Mutex
	frames []int
	ch     chan struct{}
}

func newCommitCounter() *commitCounter { return &commitCounter{ch: make(chan struct{}, 1024)} }

func (c *commitCounter) onCommit(records, _ int, _ time.Duration) {
	c.mu.Lock()
	c.frames = append(c.frames, records)
	c.mu.Unlock()
	c.ch <- struct{}{}
}

func (c *commitCounter) get() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.frames...)
}

// await waits for the next group commit; the bound is liveness, not speed.
func (c *commitCounter) await(t *testing.T) {
	t.Helper()
	select {
	case <-c.ch:
	case <-time.After(30 * time.Second):
		t.Fatal("no group commit came")
	}
}

// holdLazy keeps records nobody waits for queued for the whole test,
// unless something flushes them.
func holdLazy(t *testing.T) {
	old := lazyFlush
	lazyFlush = time.Hour
	t.Cleanup(func() { lazyFlush = old })
}

// Records nobody waits for cost no fsync of their own: they ride along
// with the next frame someone waits for, in order.
func TestLazyRecordsRideAlong(t *testing.T) {
	holdLazy(t)
	c := newCommitCounter()
	path := statePath(t)
	f := mustOpen(t, path, Options{OnCommit: c.onCommit})
	f.Commit([]Op{put("w/a", "1")}, nil)
	f.Commit([]Op{put("w/b", "2")}, nil)
	f.Commit([]Op{put("w/a", "3")}, nil)
	done := make(chan error, 1)
	f.Commit([]Op{put("m/x", "4")}, func(err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c.await(t) // OnCommit may run after the callback
	if diff := cmp.Diff([]int{4}, c.get()); diff != "" {
		t.Errorf("group commits' record counts (-want +got):\n%s", diff)
	}
	if got := string(f.Snapshot()["w/b"]); got != "2" {
		t.Errorf("a lazy record is visible to Snapshot at once: w/b = %q, want 2", got)
	}
	mustClose(t, f)
	want := map[string][]byte{"w/a": []byte("3"), "w/b": []byte("2"), "m/x": []byte("4")}
	if diff := cmp.Diff(want, reopen(t, path), asStrings); diff != "" {
		t.Errorf("after reopen (-want +got):\n%s", diff)
	}
}

// With nothing else going on, a record nobody waits for is still written,
// lazyFlush after it was queued.
func TestLazyRecordFlushesByItself(t *testing.T) {
	c := newCommitCounter()
	path := statePath(t)
	f := mustOpen(t, path, Options{OnCommit: c.onCommit})
	f.Commit([]Op{put("w/a", "1")}, nil)
	c.await(t)
	if diff := cmp.Diff([]int{1}, c.get()); diff != "" {
		t.Errorf("group commits' record counts (-want +got):\n%s", diff)
	}
	// The timer re-arms for the next one.
	f.Commit([]Op{put("w/b", "2")}, nil)
	c.await(t)
	// A copy of the files now, before Close could write anything.
	got, err := ReadOnly(path)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string][]byte{"w/a": []byte("1"), "w/b": []byte("2")}, got, asStrings); diff != "" {
		t.Errorf("durable state (-want +got):\n%s", diff)
	}
	mustClose(t, f)
}

// Wait, an empty Commit with a callback, and Close each flush what is
// queued lazily.
func TestLazyRecordsFlushOnDemand(t *testing.T) {
	holdLazy(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := newCommitCounter()
	path := statePath(t)
	f := mustOpen(t, path, Options{OnCommit: c.onCommit})

	f.Commit([]Op{put("w/a", "1")}, nil)
	if err := f.Wait(ctx, f.Apply()); err != nil {
		t.Fatalf("Wait on the latest record: %v", err)
	}
	c.await(t)
	f.Commit([]Op{put("w/b", "2")}, nil)
	done := make(chan error, 1)
	f.Commit(nil, func(err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatalf("barrier: %v", err)
	}
	c.await(t)
	if diff := cmp.Diff([]int{1, 1}, c.get()); diff != "" {
		t.Errorf("group commits' record counts (-want +got):\n%s", diff)
	}
	f.Commit([]Op{put("w/c", "3")}, nil)
	mustClose(t, f)
	want := map[string][]byte{"w/a": []byte("1"), "w/b": []byte("2"), "w/c": []byte("3")}
	if diff := cmp.Diff(want, reopen(t, path), asStrings); diff != "" {
		t.Errorf("after Close and reopen (-want +got):\n%s", diff)
	}
}

// A lazy timer that outlives its records (a waited-for frame took them
// first) must not leave the next lazy record due at once: it still rides
// along with the next waited-for one.
func TestLazyTimerOutlivingItsRecords(t *testing.T) {
	old := lazyFlush
	t.Cleanup(func() { lazyFlush = old })
	lazyFlush = 10 * time.Millisecond
	c := newCommitCounter()
	f := mustOpen(t, statePath(t), Options{OnCommit: c.onCommit})
	defer mustClose(t, f)
	commitWait := func(ops ...Op) {
		done := make(chan error, 1)
		f.Commit(ops, func(err error) { done <- err })
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		c.await(t)
	}
	f.Commit([]Op{put("w/a", "1")}, nil) // arms the timer
	commitWait(put("m/b", "2"))          // takes w/a along
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		f.mu.Lock()
		fired := f.lazyTimer == nil
		f.mu.Unlock()
		if fired {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lazy timer never fired")
		}
	}
	lazyFlush = time.Hour
	f.Commit([]Op{put("w/c", "3")}, nil)
	f.mu.Lock()
	due := f.due()
	f.mu.Unlock()
	if due {
		t.Error("a lazy record queued after a stale timer fired is due at once")
	}
	commitWait(put("m/d", "4"))
	if diff := cmp.Diff([]int{2, 2}, c.get()); diff != "" {
		t.Errorf("group commits' record counts (-want +got):\n%s", diff)
	}
}
