package jsonplan_test

import (
	"bytes"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/hypervisors/libvirt"
	"github.com/bigfleet-vm/provider/jsonplan"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/planner"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// render renders p the way every caller does: through its JSON.
func render(t *testing.T, p *jsonplan.Plan, color bool) string {
	t.Helper()
	js, err := jsonplan.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := jsonplan.RenderText(&b, js, jsonplan.TextOptions{Color: color}); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestRenderSummaryLine(t *testing.T) {
	tests := []struct {
		name string
		sum  jsonplan.Summary
		want string
	}{
		{"basic", jsonplan.Summary{Create: 3, Configure: 1, Delete: 2, Drift: 1}, "Plan: 3 to create, 1 to configure, 0 to drain, 2 to delete; 1 drift."},
		{"extended", jsonplan.Summary{Create: 1, Repair: 2, Fail: 1, Adopt: 3, Drift: 6}, "Plan: 1 to create, 0 to configure, 0 to drain, 0 to delete, 2 to repair, 1 to fail, 3 to adopt; 6 drift."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &jsonplan.Plan{FormatVersion: jsonplan.FormatVersion, Summary: tt.sum,
				Changes: []jsonplan.Change{{Machine: "m", Zone: "z", State: "CREATING", Finish: "IDLE"}}}
			lines := strings.Split(strings.TrimSpace(render(t, p, false)), "\n")
			if diff := cmp.Diff(tt.want, lines[len(lines)-1]); diff != "" {
				t.Errorf("summary (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRenderNoChanges(t *testing.T) {
	p := planner.Build(planner.Inputs{Config: planner.Config{Plugin: libvirt.Planner(libvirt.PlanSettings{}), Installation: "i"},
		Observed: &observed.Snapshot{Zones: map[string]*observed.Zone{"a": {Name: "a", Status: observed.StatusOK, At: t0}}, At: t0}, Now: t0})
	var b bytes.Buffer
	if err := planner.WriteText(&b, p, planner.TextOptions{}); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.HasSuffix(out, "\nNo changes.\n") {
		t.Errorf("empty plan renders as:\n%s", out)
	}
}

func TestRenderColorOnlyWhenAsked(t *testing.T) {
	p := &jsonplan.Plan{FormatVersion: jsonplan.FormatVersion, Summary: jsonplan.Summary{Delete: 1},
		Changes: []jsonplan.Change{{Machine: "m", Zone: "z", State: "DELETING", Intent: &jsonplan.Intent{Kind: "delete", OpID: "op-5"},
			Steps: []jsonplan.Step{{ID: "z/vm/undefine", Action: "undefine", Reason: "intent:delete"}}, Finish: "SPECULATIVE"}}}
	plain, colored := render(t, p, false), render(t, p, true)
	if strings.Contains(plain, "\x1b[") {
		t.Errorf("plain text carries ANSI escapes:\n%q", plain)
	}
	if !strings.Contains(colored, "\x1b[31m-\x1b[0m") {
		t.Errorf("coloured text lacks a red destroy symbol:\n%q", colored)
	}
	if !strings.Contains(plain, "# m (z, DELETING): Delete op-5\n  - z/vm/undefine  (intent:delete)\n  => SPECULATIVE\n") {
		t.Errorf("block:\n%s", plain)
	}
}

func TestRenderHeadlines(t *testing.T) {
	tests := []struct {
		c    jsonplan.Change
		want string
	}{
		{jsonplan.Change{Intent: &jsonplan.Intent{Kind: "create", OpID: "op-12"}}, "Create op-12"},
		{jsonplan.Change{Intent: &jsonplan.Intent{Kind: "configure", OpID: "op-3", Cluster: "c1"}}, "Configure op-3 cluster=c1"},
		{jsonplan.Change{Intent: &jsonplan.Intent{Kind: "drain", OpID: "op-4", Grace: 30}}, "Drain op-4 grace=30s"},
		{jsonplan.Change{Intent: &jsonplan.Intent{Kind: "delete", OpID: "op-5"}}, "Delete op-5"},
		{jsonplan.Change{Steps: []jsonplan.Step{{ID: "z/v/start", Action: "start"}}}, "repair"},
		{jsonplan.Change{Fail: "VM gone"}, "FAILED: VM gone"},
		{jsonplan.Change{Intent: &jsonplan.Intent{Kind: "create", OpID: "op-1"}, Fail: "create timed out after 5m0s"}, "Create op-1 -> FAILED: create timed out after 5m0s"},
		{jsonplan.Change{Adopt: &jsonplan.Adopt{Host: "z/v", VMName: "v"}}, "adopt"},
	}
	for _, tt := range tests {
		c := tt.c
		c.Machine, c.Zone, c.State = "m", "z", "X"
		p := &jsonplan.Plan{FormatVersion: jsonplan.FormatVersion, Changes: []jsonplan.Change{c}}
		if out := render(t, p, false); !strings.Contains(out, "# m (z, X): "+tt.want+"\n") {
			t.Errorf("want headline %q in:\n%s", tt.want, out)
		}
	}
}

func TestRenderRejectsOtherMajorVersion(t *testing.T) {
	var b bytes.Buffer
	if err := jsonplan.RenderText(&b, []byte(`{"format_version":"2.0"}`), jsonplan.TextOptions{}); err == nil {
		t.Error("a 2.x plan rendered without error")
	}
}

// evil is what a client may put in any string it controls: colours, a
// screen clear, a carriage return and newline that forge a line, a bell,
// a C1 control, a bidi override and an invalid byte.
const evil = "c\x1b[31m\x1b[2J\r\nPlan: 0 to create\x07\u009b1m\u202eok\xff"

// fill sets every string field reachable from v (through pointers,
// structs, slices and maps, growing empty ones by one element) to s.
func fill(v reflect.Value, s string) {
	switch v.Kind() {
	case reflect.String:
		v.SetString(s)
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		fill(v.Elem(), s)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), s)
			}
		}
	case reflect.Slice:
		if v.Len() == 0 {
			v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		}
		for i := range v.Len() {
			fill(v.Index(i), s)
		}
	case reflect.Map:
		if v.IsNil() {
			v.Set(reflect.MakeMap(v.Type()))
		}
		k := reflect.New(v.Type().Key()).Elem()
		e := reflect.New(v.Type().Elem()).Elem()
		fill(k, s)
		fill(e, s)
		v.SetMapIndex(k, e)
	}
}

// TestRenderEscapesClientText (issue 17, item 4): `provider plan` printed
// a client's cluster_id (and every other string a client or a hypervisor
// wrote) as it was, so terminal escapes could recolour, clear or forge
// plan lines. Every string field of the plan holds control characters
// here: the text has the same lines as with harmless strings, no control
// character but newline (and, coloured, only the renderer's own
// colours), and shows the strings escaped; the JSON keeps them exact.
func TestRenderEscapesClientText(t *testing.T) {
	build := func(s string) *jsonplan.Plan {
		p := &jsonplan.Plan{}
		fill(reflect.ValueOf(p).Elem(), s)
		p.FormatVersion = jsonplan.FormatVersion
		p.Changes[0].Steps[0].Action = "define"
		p.Changes[0].Steps[0].DependsOn = []string{s, s + "2"}
		p.Changes[0].Intent.Kind = "configure"
		return p
	}
	harmless := build("x")
	for _, color := range []bool{false, true} {
		out := render(t, build(evil), color)
		if got, want := strings.Count(out, "\n"), strings.Count(render(t, harmless, color), "\n"); got != want {
			t.Errorf("color %t: %d lines, want %d as with harmless strings:\n%s", color, got, want, out)
		}
		plain := out
		for _, code := range []string{"\x1b[0m", "\x1b[1m", "\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[36m", "\x1b[35m", "\x1b[2m"} {
			plain = strings.ReplaceAll(plain, code, "")
		}
		if !utf8.ValidString(plain) {
			t.Errorf("color %t: invalid UTF-8 in the text: %q", color, plain)
		}
		for _, r := range plain {
			if r != '\n' && !strconv.IsPrint(r) {
				t.Errorf("color %t: %U reaches the terminal in:\n%q", color, r, plain)
				break
			}
		}
		if q := strconv.Quote(strings.ToValidUTF8(evil, "\ufffd")); !strings.Contains(out, "cluster="+q) {
			t.Errorf("color %t: the cluster is not shown escaped as %s:\n%s", color, q, out)
		}
	}
	js, err := jsonplan.Marshal(build(evil))
	if err != nil {
		t.Fatal(err)
	}
	back, err := jsonplan.Decode(js)
	if err != nil {
		t.Fatal(err)
	}
	if got := back.Changes[0].Intent.Cluster; got != strings.ToValidUTF8(evil, "\ufffd") {
		t.Errorf("the JSON plan changed the cluster: %q", got)
	}
}

// TestRenderCapacity shows each zone's offerings against its host, the
// ratios, OVER for a resource past the allowed ratio, the pool, and a zone
// whose host could not be read with why (no invented figure).
func TestRenderCapacity(t *testing.T) {
	five, half := 5.0, 0.5
	p := &jsonplan.Plan{Capacity: &jsonplan.Capacity{MaxRatio: 1.5, Zones: []jsonplan.ZoneCapacity{
		{Zone: "h1", Status: "ok", Host: &jsonplan.Host{CPUs: 16, MemoryBytes: 64 << 30, Disk: &jsonplan.Disk{Storage: "default", TotalBytes: 200 << 30, FreeBytes: 50 << 29}},
			Offered: jsonplan.Resources{VCPU: 80, MemoryBytes: 32 << 30}, Running: jsonplan.Resources{VCPU: 6, MemoryBytes: 12 << 30},
			CPURatio: &five, MemoryRatio: &half, Over: []string{"cpu"}},
		{Zone: "h2", Status: "unknown", Error: "read capacity of zone h2: unreachable", Offered: jsonplan.Resources{VCPU: 2, MemoryBytes: 4 << 30}},
	}}}
	want := `Capacity (overcommit allowed up to 1.5):
  h1  cpu     80 vCPUs offered on 16 CPUs (ratio 5.00), 6 running  OVER
      memory  32768 MiB offered on 65536 MiB (ratio 0.50), 12288 MiB running
      disk    default: 25.0 GiB free of 200.0 GiB
  h2  host unknown: read capacity of zone h2: unreachable
      offered 2 vCPUs, 4096 MiB; running 0 vCPUs, 0 MiB
`
	if out := render(t, p, false); !strings.Contains(out, want) {
		t.Errorf("capacity rendered as:\n%s\nwant it to contain:\n%s", out, want)
	}
	p.Capacity = nil
	if out := render(t, p, false); strings.Contains(out, "Capacity") {
		t.Errorf("a plan without a capacity section renders one:\n%s", out)
	}
}
