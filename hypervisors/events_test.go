package hypervisors

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// Events pushed while nobody reads are coalesced per (zone, kind, vm)
// and carry the latest detail; Push never blocks.
func TestEventQueueCoalesces(t *testing.T) {
	q := NewEventQueue()
	defer q.Close()
	for i := 0; i < 1000; i++ {
		q.Push(Event{Zone: "a", Kind: EventVM, VM: "d1", Detail: "started"})
		q.Push(Event{Zone: "a", Kind: EventVM, VM: "d2", Detail: "started"})
	}
	q.Push(Event{Zone: "a", Kind: EventVM, VM: "d1", Detail: "stopped"})
	q.Push(Event{Zone: "b", Kind: EventZoneUp})
	var got []Event
	timeout := time.After(5 * time.Second)
	for len(got) < 3 {
		select {
		case ev := <-q.C():
			got = append(got, ev)
		case <-timeout:
			t.Fatalf("only %d events delivered: %+v", len(got), got)
		}
	}
	// The first of the 1000 d1 events may already have been in delivery.
	if got[0].VM == "d1" && got[0].Detail == "started" {
		got = append(got[:0], got[1:]...)
		select {
		case ev := <-q.C():
			got = append(got, ev)
		case <-timeout:
			t.Fatal("stopped event lost")
		}
	}
	want := []Event{
		{Zone: "a", Kind: EventVM, VM: "d1", Detail: "stopped"},
		{Zone: "a", Kind: EventVM, VM: "d2", Detail: "started"},
		{Zone: "b", Kind: EventZoneUp},
	}
	if d := cmp.Diff(want, got, cmpSortByVM()); d != "" {
		t.Errorf("events (-want +got):\n%s", d)
	}
	select {
	case ev := <-q.C():
		t.Errorf("extra event %+v", ev)
	case <-time.After(50 * time.Millisecond):
	}
	q.Close()
	for range q.C() {
	}
}

// cmpSortByVM orders events by zone, then VM, so delivery interleaving of
// distinct keys does not matter.
func cmpSortByVM() cmp.Option {
	return cmp.Transformer("sorted", func(in []Event) []Event {
		out := append([]Event(nil), in...)
		for i := range out {
			for j := i + 1; j < len(out); j++ {
				if out[j].Zone+out[j].VM < out[i].Zone+out[i].VM {
					out[i], out[j] = out[j], out[i]
				}
			}
		}
		return out
	})
}
