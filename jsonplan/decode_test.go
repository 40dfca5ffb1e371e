package jsonplan_test

import (
	"strings"
	"testing"

	"github.com/bigfleet-vm/provider/jsonplan"
)

// TestDecodeVersionRule pins how a reader of format 1.0 treats other
// versions: same major only; at or below its minor every field must be
// known; a newer minor may carry fields it ignores.
func TestDecodeVersionRule(t *testing.T) {
	plan := func(version, extra string) string {
		return `{"format_version":"` + version + `","hypervisor":"libvirt","installation":"i","lineage":"","serial":0,` +
			`"observed_at":"2026-03-01T12:00:00Z","planned_at":"2026-03-01T12:00:00Z","zones":[],"changes":[],"drift":[],` +
			`"summary":{"create":0,"configure":0,"drain":0,"delete":0,"repair":0,"fail":0,"adopt":0,"drift":0,"steps":0}` + extra + `}`
	}
	capacity := `,"capacity":{"max_ratio":1,"zones":[{"zone":"z","status":"unknown","error":"x",` +
		`"offered":{"vcpu":1,"memory_bytes":1},"running":{"vcpu":0,"memory_bytes":0}}]}`
	tests := []struct {
		name, in, wantErr string
	}{
		{"current", plan("1.1", ""), ""},
		{"capacity in 1.2", plan("1.2", capacity), ""},
		{"1.2 without capacity", plan("1.2", ""), ""},
		{"capacity claiming 1.1", plan("1.1", capacity), "format_version 1.1 carries capacity, which format_version 1.2 added"},
		{"capacity claiming 1.0", plan("1.0", capacity), "carries capacity"},
		{"capacity of a newer minor", plan("1.7", capacity), ""},
		{"unknown field in the capacity section", plan("1.2", strings.Replace(capacity, `"max_ratio":1`, `"max_ratio":1,"cost":2`, 1)), `unknown field "cost"`},
		{"older minor", plan("1.0", ""), ""},
		{"newer minor", plan("1.7", ""), ""},
		{"newer minor with a field this build does not know", plan("1.7", `,"cost":{"usd":1}`), ""},
		{"current version with an unknown field", plan("1.1", `,"cost":{"usd":1}`), `unknown field "cost"`},
		{"next major", plan("2.0", ""), "not supported"},
		{"older major", plan("0.9", ""), "not supported"},
		{"major only", plan("1", ""), "not MAJOR.MINOR"},
		{"garbage after the minor", plan("1.0beta", ""), "not MAJOR.MINOR"},
		{"three parts", plan("1.0.0", ""), "not MAJOR.MINOR"},
		{"leading zero", plan("01.0", ""), "not MAJOR.MINOR"},
		{"empty version", plan("", ""), "not MAJOR.MINOR"},
		{"no version", `{"hypervisor":"libvirt"}`, "no format_version"},
		{"null", `null`, "no format_version"},
		{"not an object", `[1,2]`, "decode plan"},
		{"trailing data", plan("1.1", "") + ` {}`, "decode plan"},
		{"wrong type", strings.Replace(plan("1.1", ""), `"serial":0`, `"serial":"x"`, 1), "decode plan"},
		{"long version is not echoed", plan(strings.Repeat("9", 10000), ""), "..."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := jsonplan.Decode([]byte(tt.in))
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Decode: %v", err)
			case tt.wantErr == "" && p.Installation != "i":
				t.Fatalf("decoded %+v", p)
			case tt.wantErr != "" && err == nil:
				t.Fatalf("Decode accepted it; want an error containing %q", tt.wantErr)
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				t.Fatalf("error %q, want it to contain %q", err, tt.wantErr)
			case err != nil && len(err.Error()) > 400:
				t.Fatalf("error is %d bytes long", len(err.Error()))
			}
		})
	}
}

// TestRenderUnknownActionOfNewerMinor renders a step whose action a
// newer minor version added with the "?" glyph instead of failing.
func TestRenderUnknownActionOfNewerMinor(t *testing.T) {
	p := &jsonplan.Plan{FormatVersion: "1.9", Changes: []jsonplan.Change{{Machine: "m", Zone: "z", State: "IDLE",
		Steps: []jsonplan.Step{{ID: "z/v/snapshot", Action: "snapshot", Reason: "drift:x"}}}}}
	out := render(t, p, false)
	if !strings.Contains(out, "  ? z/v/snapshot  (drift:x)\n") {
		t.Errorf("unknown action rendered as:\n%s", out)
	}
}

// TestRenderPluginStep marks a plug-in action (format 1.2) with its ext
// effect's glyph and shows its args, sorted and escaped.
func TestRenderPluginStep(t *testing.T) {
	p := &jsonplan.Plan{FormatVersion: "1.2", Hypervisor: "mem", Changes: []jsonplan.Change{{Machine: "m", Zone: "z", State: "CREATING",
		Steps: []jsonplan.Step{{ID: "z/v/mem-create", Action: "mem-create", Reason: "missing",
			Params: jsonplan.Params{Ext: &jsonplan.Ext{Effect: "create", Args: map[string]string{"vcpu": "2", "name": "v\x1b[31m"}}}}}}}}
	out := render(t, p, false)
	if !strings.Contains(out, `  + z/v/mem-create  name="v\x1b[31m" vcpu=2  (missing)`+"\n") {
		t.Errorf("plug-in step rendered as:\n%s", out)
	}
}

// TestMarshalWritesTheLowestVersion: a plan is written as 1.1 unless it
// carries a section of 1.2, whatever its FormatVersion field says.
func TestMarshalWritesTheLowestVersion(t *testing.T) {
	for _, tt := range []struct {
		name string
		p    jsonplan.Plan
		want string
	}{
		{"no capacity", jsonplan.Plan{FormatVersion: "1.2"}, "1.1"},
		{"capacity", jsonplan.Plan{Capacity: &jsonplan.Capacity{MaxRatio: 1}}, "1.2"},
		{"a 1.1 hypervisor", jsonplan.Plan{Hypervisor: "proxmox"}, "1.1"},
		{"a plug-in hypervisor", jsonplan.Plan{Hypervisor: "mem"}, "1.2"},
		{"a plug-in action", jsonplan.Plan{Hypervisor: "libvirt", Changes: []jsonplan.Change{{Steps: []jsonplan.Step{{Action: "snapshot"}}}}}, "1.2"},
		{"a 1.1 drift kind", jsonplan.Plan{Hypervisor: "libvirt", Drift: []jsonplan.Drift{{Kind: "seed-mismatch"}}}, "1.1"},
		{"a plug-in drift kind", jsonplan.Plan{Hypervisor: "libvirt", Drift: []jsonplan.Drift{{Kind: "snapshot-stale"}}}, "1.2"},
	} {
		b, err := jsonplan.Marshal(&tt.p)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), `"format_version": "`+tt.want+`"`) {
			t.Errorf("%s: written as\n%s\nwant format_version %s", tt.name, b, tt.want)
		}
		if got := jsonplan.VersionFor(&tt.p); got != tt.want {
			t.Errorf("%s: VersionFor = %s, want %s", tt.name, got, tt.want)
		}
	}
}
