package jsonplan_test

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/tools/txtar"

	"github.com/bigfleet-vm/provider/internal/planschema"
	"github.com/bigfleet-vm/provider/jsonplan"
	"github.com/bigfleet-vm/provider/planner"
)

// goldenPlans returns the expected plan.json of every golden case: one
// plan per situation the planner handles, so together they use every
// part of the format.
func goldenPlans(t *testing.T) map[string][]byte {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "golden", "testdata", "*.txtar"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden cases: %v", err)
	}
	out := map[string][]byte{}
	for _, f := range files {
		a, err := txtar.ParseFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, sec := range a.Files {
			if sec.Name == "plan.json" {
				out[filepath.Base(f)] = sec.Data
			}
		}
		if out[filepath.Base(f)] == nil {
			t.Fatalf("%s has no plan.json", f)
		}
	}
	return out
}

func TestGoldenPlansValidateAgainstThePublishedSchema(t *testing.T) {
	for name, js := range goldenPlans(t) {
		if err := planschema.Validate(js); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestSchemaIsClosedAndStrict checks the validator would notice a plan
// that strays from the schema, so the positive tests mean something.
func TestSchemaIsClosedAndStrict(t *testing.T) {
	base := string(goldenPlans(t)["create-on-empty-host.txtar"])
	tests := []struct{ name, old, new string }{
		{"unknown top-level field", `"lineage": "golden",`, `"lineage": "golden", "extra": 1,`},
		{"unknown step field", `"reason": "missing"`, `"reason": "missing", "extra": 1`},
		{"unknown action", `"action": "define"`, `"action": "teleport"`},
		{"other version", `"format_version": "1.1"`, `"format_version": "1.0"`},
		{"bad timestamp", `"planned_at": "2026-03-01T12:00:00Z"`, `"planned_at": "yesterday"`},
		{"negative count", `"create": 1`, `"create": -1`},
		// Format 1.1 cannot carry what 1.2 added.
		{"ext in a 1.1 plan", `"params": {`, `"params": {"ext": {"effect": "create"},`},
		{"another hypervisor in a 1.1 plan", `"hypervisor": "libvirt"`, `"hypervisor": "mem"`},
		{"a plug-in action in a 1.1 plan", `"action": "define"`, `"action": "mem-create"`},
		{"a plug-in drift kind in a 1.1 plan", `"drift": []`, `"drift": [{"zone": "h1", "kind": "mem-stale", "policy": "repair", "detail": "x"}]`},
		{"a drift kind out of pattern", `"drift": []`, `"drift": [{"zone": "h1", "kind": "Stale", "policy": "repair", "detail": "x"}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(base, tt.old) {
				t.Fatalf("fixture lacks %q", tt.old)
			}
			if err := planschema.Validate([]byte(strings.Replace(base, tt.old, tt.new, 1))); err == nil {
				t.Error("the schema accepts it")
			}
		})
	}
}

// TestSchemaEnumsMatchTheCode keeps the closed sets of the schema, of
// this package and of the planner equal.
func TestSchemaEnumsMatchTheCode(t *testing.T) {
	raw, err := planschema.Raw()
	if err != nil {
		t.Fatal(err)
	}
	defs := raw["$defs"].(map[string]any)
	enum := func(v any) []string {
		var out []string
		for _, e := range v.(map[string]any)["enum"].([]any) {
			out = append(out, e.(string))
		}
		slices.Sort(out)
		return out
	}
	prop := func(def, p string) any {
		return defs[def].(map[string]any)["properties"].(map[string]any)[p]
	}
	var policies []string
	kinds := slices.Clone(jsonplan.DriftKinds11)
	for _, p := range []planner.Policy{planner.PolicyRepair, planner.PolicyReport, planner.PolicyFail, planner.PolicyAdopt} {
		policies = append(policies, string(p))
	}
	slices.Sort(kinds)
	slices.Sort(policies)
	for _, c := range []struct {
		name      string
		want, got []string
	}{
		{"action", jsonplan.Actions(), enum(defs["action11"])},
		{"drift kind of format 1.1", kinds, enum(defs["driftKind11"])},
		{"drift policy", policies, enum(prop("drift", "policy"))},
	} {
		if diff := cmp.Diff(c.want, c.got); diff != "" {
			t.Errorf("%s: code vs docs/plan.schema.json (-code +schema):\n%s", c.name, diff)
		}
	}
	if diff := cmp.Diff(jsonplan.Versions(), enum(raw["properties"].(map[string]any)["format_version"])); diff != "" {
		t.Errorf("format_version: code vs docs/plan.schema.json (-code +schema):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"cpu", "memory"}, enum(prop("zone_capacity", "over").(map[string]any)["items"])); diff != "" {
		t.Errorf("capacity over: (-code +schema):\n%s", diff)
	}
}

// TestSchemaOfFormat12 checks what format 1.2 adds: a plan of a plug-in
// hypervisor with a plug-in action and its ext validates; a closed ext
// refuses what it does not define.
func TestSchemaOfFormat12(t *testing.T) {
	var doc map[string]any
	if err := json.Unmarshal(goldenPlans(t)["create-on-empty-host.txtar"], &doc); err != nil {
		t.Fatal(err)
	}
	doc["format_version"], doc["hypervisor"] = "1.2", "mem"
	for _, c := range doc["changes"].([]any) {
		for _, st := range c.(map[string]any)["steps"].([]any) {
			if st := st.(map[string]any); st["action"] == "define" {
				st["action"] = "mem-create"
				st["params"] = map[string]any{"ext": map[string]any{"effect": "create", "args": map[string]any{"name": "bf-x", "vcpu": "2"}}}
			}
		}
	}
	doc["drift"] = []any{map[string]any{"zone": "h1", "kind": "mem-stale", "policy": "repair", "detail": "a drift kind of the plug-in's own"}}
	raw, _ := json.MarshalIndent(doc, "", "  ")
	base := string(raw)
	if err := planschema.Validate(raw); err != nil {
		t.Fatalf("a 1.2 plan of a plug-in hypervisor: %v", err)
	}
	p, err := jsonplan.Decode(raw)
	if err != nil {
		t.Fatalf("Decode of a 1.2 plan: %v", err)
	}
	if got := jsonplan.VersionFor(p); got != "1.2" {
		t.Errorf("VersionFor = %s, want 1.2", got)
	}
	if _, err := jsonplan.Decode([]byte(strings.Replace(base, `"format_version": "1.2"`, `"format_version": "1.1"`, 1))); err == nil ||
		!strings.Contains(err.Error(), "which format_version 1.2 added") {
		t.Errorf("Decode of a 1.2 plan claiming 1.1: %v, want a refusal", err)
	}
	for _, tt := range []struct{ name, old, new string }{
		{"unknown ext key", `"effect": "create"`, `"effect": "create", "extra": 1`},
		{"unknown effect", `"effect": "create"`, `"effect": "teleport"`},
		{"an arg that is a number", `"vcpu": "2"`, `"vcpu": 2`},
		{"an arg name out of pattern", `"vcpu": "2"`, `"VCPU": "2"`},
		{"another version", `"format_version": "1.2"`, `"format_version": "1.3"`},
		{"the same plan claiming 1.1", `"format_version": "1.2"`, `"format_version": "1.1"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(base, tt.old) {
				t.Fatalf("fixture lacks %q", tt.old)
			}
			if err := planschema.Validate([]byte(strings.Replace(base, tt.old, tt.new, 1))); err == nil {
				t.Error("the schema accepts it")
			}
		})
	}
}

// capacityPlan is the create-on-empty-host golden plan with a capacity
// section of two zones, one read and over, one not read, encoded by
// Marshal (so in the version it picks).
func capacityPlan(t *testing.T) string {
	t.Helper()
	p, err := jsonplan.Decode(goldenPlans(t)["create-on-empty-host.txtar"])
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	two, half := 2.0, 0.5
	p.Capacity = &jsonplan.Capacity{MaxRatio: 1.5, Zones: []jsonplan.ZoneCapacity{
		{Zone: "h1", Status: "ok", ReadAt: &at,
			Host:    &jsonplan.Host{CPUs: 4, MemoryBytes: 16 << 30, Disk: &jsonplan.Disk{Storage: "default", TotalBytes: 100 << 30, FreeBytes: 0}},
			Offered: jsonplan.Resources{VCPU: 8, MemoryBytes: 8 << 30}, Running: jsonplan.Resources{VCPU: 2, MemoryBytes: 2 << 30},
			CPURatio: &two, MemoryRatio: &half, Over: []string{"cpu"}},
		{Zone: "h2", Status: "unknown", Error: "read capacity of zone h2: unreachable",
			Offered: jsonplan.Resources{VCPU: 2, MemoryBytes: 4 << 30}},
	}}
	b, err := jsonplan.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestCapacitySectionIsVersion12 pins the version rule for the capacity
// section: a plan carrying it is 1.2 and valid, and the schema refuses it
// claiming 1.1, a 1.2 plan without it (the lowest version is written),
// and a section that strays from its definition.
func TestCapacitySectionIsVersion12(t *testing.T) {
	base := capacityPlan(t)
	if !strings.Contains(base, `"format_version": "1.2"`) {
		t.Fatalf("a plan with a capacity section is not written as 1.2:\n%s", base[:200])
	}
	if err := planschema.Validate([]byte(base)); err != nil {
		t.Fatalf("the capacity plan is invalid: %v", err)
	}
	noCapacity := string(goldenPlans(t)["create-on-empty-host.txtar"])
	tests := []struct{ name, in, old, new string }{
		{"capacity claiming 1.1", base, `"format_version": "1.2"`, `"format_version": "1.1"`},
		{"1.2 without capacity", noCapacity, `"format_version": "1.1"`, `"format_version": "1.2"`},
		{"unknown capacity field", base, `"max_ratio": 1.5,`, `"max_ratio": 1.5, "extra": 1,`},
		{"unknown zone field", base, `"status": "ok",`, `"status": "ok", "extra": 1,`},
		{"unknown status", base, `"status": "ok",`, `"status": "full",`},
		{"ok without a host", base, `"status": "unknown",`, `"status": "ok",`},
		{"unknown with a host", base, `"status": "ok",`, `"status": "unknown", "error": "x",`},
		{"unknown without a reason", base, `"error": "read capacity of zone h2: unreachable",`, ``},
		{"disk over", base, `"over": [`, `"over": ["disk",`},
		{"negative ratio", base, `"cpu_ratio": 2,`, `"cpu_ratio": -2,`},
		{"zero max ratio", base, `"max_ratio": 1.5,`, `"max_ratio": 0,`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(tt.in, tt.old) {
				t.Fatalf("fixture lacks %q:\n%s", tt.old, tt.in)
			}
			if err := planschema.Validate([]byte(strings.Replace(tt.in, tt.old, tt.new, 1))); err == nil {
				t.Error("the schema accepts it")
			}
		})
	}
}
