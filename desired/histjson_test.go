package desired

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// The appended JSON of an event is byte for byte encoding/json's: stored
// histories of earlier releases and of this one read the same, and a
// reader of the raw record sees no difference.
func TestEventJSONMatchesEncodingJSON(t *testing.T) {
	exit := 3
	zero := 0
	events := []Event{
		{},
		{Seq: 1, At: time.Date(2026, 12, 4, 6, 0, 0, 0, time.UTC), Kind: "transition", From: "SPECULATIVE", To: "CREATING", OpID: "op-1", Cause: "rpc"},
		{Seq: 1 << 60, At: time.Date(2026, 1, 2, 3, 4, 5, 600, time.UTC), Kind: "step", Action: "define", DurationMS: -7, Outcome: "ok", Class: "transient", Exit: &exit},
		{Kind: "guest", Exit: &zero, Reason: `say "no" \ to <b>&</b>`},
		{Kind: "drift", Error: "line one\nline two\ttab\x00nul\x1fus"},
		{Kind: "é ünïcode ✓", Reason: "sep\u2028and\u2029", Error: "bad \xff utf-8 \xc3"},
		{At: time.Date(2026, 6, 1, 0, 0, 0, 0, time.FixedZone("x", 3600)), Kind: "zone offset"},
		{At: time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC), Kind: "last year"},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []rune("aZ09 -_:/.\"\\<>&\n\t\x01é✓\u2028")
	text := func() string {
		var b strings.Builder
		for range rng.IntN(12) {
			b.WriteRune(alphabet[rng.IntN(len(alphabet))])
		}
		return b.String()
	}
	for range 500 {
		ev := Event{Seq: rng.Uint64(), At: time.Unix(rng.Int64N(4e9), rng.Int64N(1e9)).UTC(),
			Kind: text(), From: text(), To: text(), OpID: text(), Cause: text(), Action: text(),
			Reason: text(), DurationMS: rng.Int64N(1e6) - 5e5, Outcome: text(), Class: text(), Error: text()}
		if rng.IntN(2) == 0 {
			e := rng.IntN(512) - 256
			ev.Exit = &e
		}
		events = append(events, ev)
	}
	for _, ev := range events {
		want, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		got, err := appendEvent([]byte("prefix"), &ev)
		if err != nil {
			t.Fatalf("appendEvent(%+v): %v", ev, err)
		}
		if string(got) != "prefix"+string(want) {
			t.Fatalf("appendEvent(%+v)\n got %s\nwant prefix%s", ev, got, want)
		}
	}
	// Where encoding/json fails, so does appendEvent.
	bad := Event{At: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}
	if _, err := json.Marshal(bad); err == nil {
		t.Fatal("encoding/json encoded the year 10000")
	}
	if _, err := appendEvent(nil, &bad); err == nil {
		t.Error("appendEvent encoded the year 10000, encoding/json refuses it")
	}
}

// A ring's record is built in one allocation of its size, and reads back
// as the ring.
func TestRingEncodeAllocatesOnce(t *testing.T) {
	r := &ring{zone: "host-a"}
	for i := range DefaultHistoryEvents {
		raw, err := appendEvent(nil, &Event{Seq: uint64(i + 1), Kind: "step", Action: "start"})
		if err != nil {
			t.Fatal(err)
		}
		r.entries = append(r.entries, histEntry{seq: uint64(i + 1), raw: raw})
	}
	if n := testing.AllocsPerRun(20, func() { r.encode() }); n != 1 {
		t.Errorf("encoding a ring of %d events took %v allocations, want 1", len(r.entries), n)
	}
	r.deleted = time.Date(2026, 12, 4, 0, 0, 0, 123456789, time.UTC)
	if n := testing.AllocsPerRun(20, func() { r.encode() }); n != 1 {
		t.Errorf("encoding a deleted ring took %v allocations, want 1", n)
	}
	var got storedRing
	if err := json.Unmarshal(r.encode(), &got); err != nil {
		t.Fatal(err)
	}
	if got.V != 1 || got.Zone != "host-a" || !got.Deleted.Equal(r.deleted) || len(got.Events) != len(r.entries) {
		t.Errorf("decoded ring v=%d zone=%q deleted=%v events=%d, want 1 host-a %v %d", got.V, got.Zone, got.Deleted, len(got.Events), r.deleted, len(r.entries))
	}
	for i, e := range got.Events {
		if string(e) != string(r.entries[i].raw) {
			t.Fatalf("event %d reads back %s, want %s", i, e, r.entries[i].raw)
		}
	}
}
