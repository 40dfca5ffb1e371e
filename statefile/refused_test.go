package statefile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestRefusedRecordsKeepNothing runs many create/delete cycles, each with
// a record Apply refuses (over the size limit): every refusal stays an
// error for every Wait, also after later records are durable, it takes no
// sequence number from the records around it, and it keeps nothing in
// memory (issue 18: each one stayed in a set for the store's life). The
// allocation count of a refused Apply is the proof: zero, so there is
// nothing it could have kept.
func TestRefusedRecordsKeepNothing(t *testing.T) {
	f := mustOpen(t, statePath(t), Options{})
	defer mustClose(t, f)
	huge := []Op{{Key: "m/huge", Value: make([]byte, maxRecord+1)}} // never touched: no real memory
	var refusals []uint64
	for i := range 200 {
		key := fmt.Sprintf("m/%d", i)
		before := mustApply(t, f, put(key, "created"))
		r := f.Apply(huge...)
		refusals = append(refusals, r)
		after := mustApply(t, f, del(key))
		if after != before+1 && i == 0 {
			t.Errorf("the refusal took a sequence number (%d, then %d)", before, after)
		}
	}
	for _, r := range refusals {
		err := f.Wait(context.Background(), r)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("exceeds the %d-byte limit", maxRecord)) {
			t.Fatalf("Wait on a refused record after later ones are durable: %v", err)
		}
	}
	if got := f.Snapshot(); len(got) != 0 {
		t.Errorf("state after the cycles: %v", keys(got))
	}
	if allocs := testing.AllocsPerRun(1000, func() { f.Apply(huge...) }); allocs != 0 {
		t.Errorf("a refused Apply allocates %v times: it keeps something per refusal", allocs)
	}
}

// TestLaterFailureRefusesNoDurableFrame (e2e
// TestFullDiskChangeIsNeverVisible failed about 1 run in 30 under load):
// a frame already fsynced to the journal, but not yet in the mark because
// the marker was busy, used to be answered with the store's failure when
// the next frame's append hit a full disk. Its whole frame stayed in the
// journal and Open replays whole frames, so a Create the client was told
// was refused came back after a restart. The append fails here with a
// real ENOSPC: the committer appends to /dev/full once the first frame is
// fsynced and the marker is held. Every batch must be acknowledged and
// recovered, or refused and never recovered, and Wait must say what the
// callback said; the frame fsynced before the failure is acknowledged.
func TestLaterFailureRefusesNoDurableFrame(t *testing.T) {
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skipf("no /dev/full: %v", err)
	}
	defer full.Close()
	path := statePath(t)
	f := mustOpen(t, path, Options{CompactBytes: -1})
	mustApply(t, f, put("m/before", "1"))

	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	markerHook = func() { once.Do(func() { close(held); <-release }) }
	firstErr, secondErr := make(chan error, 1), make(chan error, 1)
	f.Commit([]Op{put("m/first", "1")}, func(err error) { firstErr <- err })
	f.mu.Lock()
	firstSeq := f.lastSeq
	f.mu.Unlock()
	// The marker woke for the first frame: it is written and fsynced.
	<-held
	// The committer is idle (it handed the frame over) and reads the
	// field again only after the next Commit wakes it.
	journal := f.journal
	f.journal = full
	f.Commit([]Op{put("m/second", "1")}, func(err error) { secondErr <- err })
	<-f.Stopped()
	close(release)
	first, second := <-firstErr, <-secondErr
	image := copyState(t, path) // kill -9 now
	wait := f.Wait(context.Background(), firstSeq)
	markerHook = nil
	f.mu.Lock() // the committer has stopped writing: it failed
	f.journal = journal
	f.mu.Unlock()
	f.Close()

	if !errors.Is(second, syscall.ENOSPC) {
		t.Fatalf("the append to a full disk: %v, want ENOSPC", second)
	}
	if first != nil {
		t.Errorf("the frame fsynced before the failure was refused: %v", first)
	}
	if (first == nil) != (wait == nil) {
		t.Errorf("the first record: callback %v, Wait %v", first, wait)
	}
	got, err := ReadOnly(image)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{"m/before": []byte("1")}
	if first == nil {
		want["m/first"] = []byte("1")
	}
	if diff := cmp.Diff(want, got, asStrings); diff != "" {
		t.Errorf("recovered after the first record got %v (-want +got):\n%s", first, diff)
	}
	if diff := cmp.Diff(want, reopen(t, image), asStrings); diff != "" {
		t.Errorf("Open after the first record got %v (-want +got):\n%s", first, diff)
	}
}

// TestFailedMarkAcknowledgesNothingLater: once the mark could not be
// written, no frame is acknowledged any more, not even one appended and
// fsynced afterwards while the mark file works again: a record after a
// refused one may depend on it. The committer is held with the second
// batch taken off the queue while the first frame's mark write fails
// (ENOSPC from /dev/full).
func TestFailedMarkAcknowledgesNothingLater(t *testing.T) {
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skipf("no /dev/full: %v", err)
	}
	defer full.Close()
	f := mustOpen(t, statePath(t), Options{CompactBytes: -1})
	mustApply(t, f, put("m/before", "1"))

	markerHeld, releaseMarker := make(chan struct{}), make(chan struct{})
	committerHeld, releaseCommitter := make(chan struct{}), make(chan struct{})
	var markerOnce, committerOnce sync.Once
	markerHook = func() { markerOnce.Do(func() { close(markerHeld); <-releaseMarker }) }
	firstErr, secondErr := make(chan error, 1), make(chan error, 1)
	f.Commit([]Op{put("m/first", "1")}, func(err error) { firstErr <- err })
	<-markerHeld
	committerHook = func() { committerOnce.Do(func() { close(committerHeld); <-releaseCommitter }) }
	f.Commit([]Op{put("m/second", "1")}, func(err error) { secondErr <- err })
	<-committerHeld
	mark := f.mark.f
	f.mark.f = full // the marker is held: it reads the field once released
	close(releaseMarker)
	<-f.Stopped()
	f.mark.f = mark // the marker failed: it is idle until the next frame
	close(releaseCommitter)
	first, second := <-firstErr, <-secondErr
	markerHook, committerHook = nil, nil
	f.Close()

	if !errors.Is(first, syscall.ENOSPC) {
		t.Fatalf("the first frame, whose mark write failed: %v, want ENOSPC", first)
	}
	if second == nil {
		t.Error("a frame was acknowledged after the mark write failed")
	}
}
