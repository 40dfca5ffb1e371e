package jsonplan_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

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
	var kinds, policies []string
	for _, k := range planner.DriftKinds {
		kinds = append(kinds, string(k))
	}
	for _, p := range []planner.Policy{planner.PolicyRepair, planner.PolicyReport, planner.PolicyFail, planner.PolicyAdopt} {
		policies = append(policies, string(p))
	}
	slices.Sort(kinds)
	slices.Sort(policies)
	for _, c := range []struct {
		name      string
		want, got []string
	}{
		{"action", jsonplan.Actions(), enum(defs["action"])},
		{"drift kind", kinds, enum(prop("drift", "kind"))},
		{"drift policy", policies, enum(prop("drift", "policy"))},
	} {
		if diff := cmp.Diff(c.want, c.got); diff != "" {
			t.Errorf("%s: code vs docs/plan.schema.json (-code +schema):\n%s", c.name, diff)
		}
	}
	v := raw["properties"].(map[string]any)["format_version"].(map[string]any)["const"]
	if v != jsonplan.FormatVersion {
		t.Errorf("the schema describes format_version %v, this build writes %s", v, jsonplan.FormatVersion)
	}
}
