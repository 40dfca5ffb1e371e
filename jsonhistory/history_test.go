package jsonhistory_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/internal/planschema"
	"github.com/bigfleet-vm/provider/jsonhistory"
)

var t0 = time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)

func sample() *jsonhistory.History {
	zero, one := 0, 1
	return &jsonhistory.History{GeneratedAt: t0, Query: jsonhistory.Query{Machine: "z1/kvm.small/000"},
		Machines: []jsonhistory.Machine{{ID: "z1/kvm.small/000", Zone: "z1", State: "FAILED", Events: []jsonhistory.Event{
			{Seq: 1, At: t0, Kind: "transition", From: "SPECULATIVE", To: "CREATING", OpID: "op-1", Cause: "rpc"},
			{Seq: 2, At: t0.Add(41 * time.Second), Kind: "step", OpID: "op-1", Action: "clone", Reason: "intent:create", DurationMS: 41000, Outcome: "ok"},
			{Seq: 3, At: t0.Add(136 * time.Second), Kind: "step", OpID: "op-1", Action: "wait-agent", Reason: "intent:create", DurationMS: 95000, Outcome: "ok"},
			{Seq: 4, At: t0.Add(137 * time.Second), Kind: "transition", From: "CREATING", To: "IDLE", OpID: "op-1", Cause: "completed"},
			{Seq: 5, At: t0.Add(200 * time.Second), Kind: "drift", Reason: "stopped", Action: "repair: start"},
			{Seq: 6, At: t0.Add(300 * time.Second), Kind: "guest", OpID: "op-2", Action: "exec-bootstrap", Outcome: "ok", Exit: &zero},
			{Seq: 7, At: t0.Add(400 * time.Second), Kind: "guest", OpID: "op-3", Action: "exec-drain", Outcome: "exited", Exit: &one},
			{Seq: 8, At: t0.Add(400 * time.Second), Kind: "step", OpID: "op-3", Action: "exec-drain", Outcome: "error", Class: "other", Error: "drain exited 1"},
			{Seq: 9, At: t0.Add(401 * time.Second), Kind: "transition", From: "DRAINING", To: "FAILED", OpID: "op-3", Cause: "error", Error: "drain failed: drain exited 1"},
		}}}}
}

// What Marshal writes validates against the published schema and reads
// back unchanged.
func TestMarshalValidatesAndRoundTrips(t *testing.T) {
	h := sample()
	raw, err := jsonhistory.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	if err := planschema.ValidateHistory(raw); err != nil {
		t.Fatalf("schema: %v\n%s", err, raw)
	}
	back, err := jsonhistory.Decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(h, back); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	// An empty fleet timeline is valid too (machines [], not null).
	raw, _ = jsonhistory.Marshal(&jsonhistory.History{GeneratedAt: t0})
	if err := planschema.ValidateHistory(raw); err != nil {
		t.Errorf("empty: %v\n%s", err, raw)
	}
}

// The version rule: another major is refused, an unknown field of this
// build's minor is refused, a newer minor's unknown fields are ignored.
func TestDecodeVersionRule(t *testing.T) {
	for _, tt := range []struct {
		name, doc, err string
	}{
		{"no version", `{"machines":[]}`, "no format_version"},
		{"bad version", `{"format_version":"01.0"}`, "not MAJOR.MINOR"},
		{"another major", `{"format_version":"2.0","machines":[]}`, "not supported"},
		{"unknown field of this minor", `{"format_version":"1.0","machines":[],"x":1}`, "unknown field"},
		{"newer minor", `{"format_version":"1.7","machines":[],"x":1}`, ""},
		{"trailing data", `{"format_version":"1.0","machines":[]} {}`, "decode history"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := jsonhistory.Decode([]byte(tt.doc))
			if tt.err == "" && err != nil || tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)) {
				t.Errorf("err %v, want %q", err, tt.err)
			}
		})
	}
}

// The text form is a timeline with the time of each operation and where
// it went, and it escapes text a client or a guest chose.
func TestTextTimelineAndEscaping(t *testing.T) {
	var b bytes.Buffer
	if err := jsonhistory.Write(&b, sample()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"SPECULATIVE → CREATING  op-1 (rpc)",
		"+41s",
		"step clone ok in 41s [intent:create]",
		"op-1 SPECULATIVE → IDLE took 2m17s: wait-agent 1m35s, clone 41s",
		"guest exec-drain exited 1",
		"DRAINING → FAILED  op-3 (error): drain failed: drain exited 1",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	h := sample()
	h.Query.Machine = "evil\x1b[2J"
	h.Machines[0].ID = "evil\x1b[2J"
	h.Machines[0].Events[8].Error = "hook said \x1b[31mred\r\nforged line"
	b.Reset()
	jsonhistory.Write(&b, h)
	if strings.ContainsAny(b.String(), "\x1b\r") || strings.Contains(b.String(), "\nforged") {
		t.Errorf("control characters reached the terminal:\n%q", b.String())
	}
	// A fleet timeline lists every event in time order with its machine.
	h = sample()
	h.Query = jsonhistory.Query{Zone: "z1"}
	b.Reset()
	jsonhistory.Write(&b, h)
	if lines := strings.Count(b.String(), "z1/kvm.small/000"); lines != 9 {
		t.Errorf("fleet timeline: %d lines name the machine, want 9:\n%s", lines, b.String())
	}
}
