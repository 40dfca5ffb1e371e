package statefile

import (
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A group commit writes its frame from the buffer of a frame before
// (maxSpares kept at most): on the durable walk the frame buffers grown anew
// for every commit were a fifth of everything the provider allocated.
func TestGroupCommitReusesItsFrameBuffer(t *testing.T) {
	f := mustOpen(t, statePath(t), Options{NoSync: true, CompactBytes: -1})
	defer mustClose(t, f)
	value := strings.Repeat("v", 16<<10)
	op := put("k", value)
	mustApply(t, f, op) // the first frame grows the buffer

	const commits = 200
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range commits {
		mustApply(t, f, op)
	}
	runtime.ReadMemStats(&after)
	// The state's own copy of the value is allocated every time; a fresh
	// frame buffer would be more than as much again.
	per := (after.TotalAlloc - before.TotalAlloc) / commits
	if limit := uint64(len(value)) + 4<<10; per > limit {
		t.Errorf("a %d-byte commit allocated %d bytes, want at most %d (the value's copy and a little): the frame buffer is not reused", len(value), per, limit)
	}
}

// The buffers kept between frames are bounded: after a frame above
// spareCap it is not kept (only the small one before it is).
func TestGroupCommitKeepsNoHugeBuffer(t *testing.T) {
	f := mustOpen(t, statePath(t), Options{NoSync: true, CompactBytes: -1})
	defer mustClose(t, f)
	mustApply(t, f, put("small", "v"))
	if c := f.spareCap(); c == 0 || c > spareCap {
		t.Fatalf("after a small frame the spares hold %d bytes, want one buffer of at most %d", c, spareCap)
	}
	mustApply(t, f, put("big", strings.Repeat("v", 2*spareCap)))
	if c := f.spareCap(); c > spareCap {
		t.Errorf("after a %d-byte frame the spares hold %d bytes, want at most %d", 2*spareCap, c, spareCap)
	}
}

// Under load a batch fills while the frame before is written: both
// buffers come back and neither is grown anew. With one kept, the
// returning frame's buffer pushed out the kept one every round, and every
// other batch grew a buffer from 4 KiB.
func TestGroupCommitReusesBuffersWhileAFrameIsWritten(t *testing.T) {
	f := mustOpen(t, statePath(t), Options{NoSync: true, CompactBytes: -1})
	defer mustClose(t, f)
	value := strings.Repeat("v", 16<<10)
	op := put("k", value)
	// Armed before each round's first commit, so the committer holds
	// exactly that frame, whenever it gets to it.
	var armed atomic.Bool
	held, release := make(chan struct{}), make(chan struct{})
	committerHook = func() {
		if armed.CompareAndSwap(true, false) {
			held <- struct{}{}
			<-release
		}
	}
	defer func() { committerHook = nil }()
	wait := func(what string, c <-chan error) {
		select {
		case err := <-c:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s not done within 10s", what)
		}
	}
	round := func() {
		first, second := make(chan error, 1), make(chan error, 1)
		armed.Store(true)
		f.Commit([]Op{op}, func(err error) { first <- err })
		select {
		case <-held: // the committer holds the first frame
		case <-time.After(10 * time.Second):
			t.Fatal("the committer never reached the first frame")
		}
		f.Commit([]Op{op}, func(err error) { second <- err })
		release <- struct{}{}
		wait("first commit", first)
		wait("second commit", second)
	}
	round() // grows both buffers
	round()
	const rounds = 100
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range rounds {
		round()
	}
	runtime.ReadMemStats(&after)
	// Two copies of the value into the state a round, and a little.
	per := (after.TotalAlloc - before.TotalAlloc) / rounds
	if limit := 2*uint64(len(value)) + 4<<10; per > limit {
		t.Errorf("a round of two %d-byte commits allocated %d bytes, want at most %d: a frame buffer was grown anew", len(value), per, limit)
	}
	if n := f.spareCount(); n > maxSpares {
		t.Errorf("%d buffers kept, want at most %d", n, maxSpares)
	}
}

// spareCap is the capacity of the buffers kept, together.
func (f *File) spareCap() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, b := range f.spares {
		n += cap(b)
	}
	return n
}

func (f *File) spareCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.spares)
}
