package statefile

import (
	"runtime"
	"strings"
	"testing"
)

// A group commit writes its frame from the buffer of the frame before
// (one kept at most): on the durable walk the frame buffers grown anew
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

// The buffer kept between frames is bounded: after a frame above
// spareCap none is kept.
func TestGroupCommitKeepsNoHugeBuffer(t *testing.T) {
	f := mustOpen(t, statePath(t), Options{NoSync: true, CompactBytes: -1})
	defer mustClose(t, f)
	mustApply(t, f, put("small", "v"))
	if c := f.spareCap(); c == 0 || c > spareCap {
		t.Fatalf("after a small frame the spare holds %d bytes, want one buffer of at most %d", c, spareCap)
	}
	mustApply(t, f, put("big", strings.Repeat("v", 2*spareCap)))
	if c := f.spareCap(); c > spareCap {
		t.Errorf("after a %d-byte frame the spare holds %d bytes, want at most %d", 2*spareCap, c, spareCap)
	}
}

func (f *File) spareCap() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return cap(f.spare)
}
