package planner_test

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvespec"
	"github.com/bigfleet-vm/provider/jsonplan"
	"github.com/bigfleet-vm/provider/naming"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/planner"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// TestActionProperties pins both properties of every action: the glyph
// the human plan shows and whether the executor re-reads the live marker
// before it (OwnerCheck). They are independent facts; neither is derived
// from the other.
func TestActionProperties(t *testing.T) {
	type props struct {
		Symbol     string
		OwnerCheck bool
	}
	want := map[string]props{
		"create-overlay": {"+", false}, "create-seed": {"+", false},
		"define": {"+", false}, "clone": {"+", false},
		"start": {">", false}, "resume": {">", false},
		"configure-vm": {"~", false}, "autostart": {"~", false}, "wait-agent": {"~", false},
		"bind": {"~", false}, "unbind": {"~", false}, "exec-bootstrap": {"~", false},
		"exec-ready": {"~", false}, "exec-drain": {"~", false},
		"stop": {"-", true}, "undefine": {"-", true},
		"delete-volume": {"-", false}, "delete-vm": {"-", true},
	}
	glyph := map[hypervisors.Effect]string{hypervisors.EffectCreate: "+", hypervisors.EffectStart: ">",
		hypervisors.EffectChange: "~", hypervisors.EffectDestroy: "-"}
	got := map[string]props{}
	for _, a := range shippedActions() {
		got[a.Name] = props{planner.Action(a.Name).Symbol(), a.OwnerCheck}
		if g := glyph[a.Effect]; g != planner.Action(a.Name).Symbol() {
			t.Errorf("%s: effect %s is %q in the human plan, but format 1.1 marks it %q", a.Name, a.Effect, g, planner.Action(a.Name).Symbol())
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("action properties (-want +got):\n%s", diff)
	}
	unknown := planner.Step{Action: "no-such-action"}
	if !unknown.Info().OwnerCheck || !unknown.Info().Heavy {
		t.Error("a step of an unknown action is neither owner-checked nor bounded per zone")
	}
}

// TestShippedDriftKindsAreFormat11: the core's drift kinds and those the
// libvirt and Proxmox plug-ins declare are exactly the kinds plan format
// 1.1 defines (a plug-in kind outside them makes a plan 1.2).
func TestShippedDriftKindsAreFormat11(t *testing.T) {
	var got []string
	for _, pl := range []planner.Plugin{libvirt.Planner(libvirt.PlanSettings{}), proxmox.Planner(proxmox.PlanSettings{})} {
		for _, k := range pl.DriftKinds() {
			got = append(got, string(k))
		}
	}
	for _, k := range planner.DriftKinds {
		got = append(got, string(k))
	}
	slices.Sort(got)
	want := slices.Sorted(slices.Values(jsonplan.DriftKinds11))
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("drift kinds (-format 1.1 +core and shipped plug-ins):\n%s", diff)
	}
}

// shippedActions are the core actions and the libvirt and Proxmox
// plug-ins' (format 1.1 knows exactly these).
func shippedActions() []hypervisors.ActionInfo {
	return slices.Concat(planner.CoreActions, lvspec.Actions, pvespec.Actions)
}

// TestActionsMatchTheJSONFormat keeps the planner's closed set of actions
// and the JSON format's in step: a new action is a format change.
func TestActionsMatchTheJSONFormat(t *testing.T) {
	var mine []string
	for _, a := range shippedActions() {
		mine = append(mine, a.Name)
	}
	slices.Sort(mine)
	if diff := cmp.Diff(jsonplan.Actions(), mine); diff != "" {
		t.Errorf("planner actions vs JSON format %s actions (-json +planner); a new action needs a format_version bump:\n%s",
			jsonplan.FormatVersion, diff)
	}
}

// TestJSONDecidesEveryAdapterField walks the adapter spec structs a step
// carries and checks each field is either in the JSON plan (under the
// listed key) or deliberately left out. A field added to an adapter spec
// fails here until someone decides, so the JSON plan never changes by
// accident and never silently lacks a parameter people check.
func TestJSONDecidesEveryAdapterField(t *testing.T) {
	// spec -> Go field -> JSON key under params.<spec>; "" would mean
	// deliberately left out (with a comment saying why).
	decisions := map[string]map[string]string{
		"overlay": {"Pool": "pool", "Name": "name", "BaseImage": "base_image", "MinCapacityGiB": "min_capacity_gib"},
		"seed": {"Pool": "pool", "Name": "name", "InstanceID": "instance_id", "Hostname": "hostname",
			"UserData": "user_data"},
		"domain": {"Name": "name", "VCPU": "vcpu", "MemoryMiB": "memory_mib", "DomainType": "domain_type",
			"Pool": "pool", "Overlay": "overlay", "Seed": "seed", "Network": "network",
			"Kernel": "kernel", "Initrd": "initrd", "Cmdline": "cmdline", "Marker": "marker",
			"Labels": "labels"},
		"clone": {"Name": "name", "TemplateVMID": "template_vmid", "Pool": "pool", "Marker": "marker",
			"Labels": "labels"},
		"size":   {"VCPU": "vcpu", "MemoryMiB": "memory_mib", "OnBoot": "onboot", "Marker": "marker"},
		"marker": {"Installation": "installation", "MachineID": "machine_id", "OpID": "op_id", "InstanceType": "instance_type", "Cluster": "cluster"},
	}
	stepParams := map[string]hypervisors.StepParams{"overlay": &lvspec.OverlaySpec{}, "seed": &lvspec.SeedSpec{},
		"domain": &lvspec.DomainSpec{}, "clone": &pvespec.CloneSpec{}, "size": &pvespec.SizeSpec{}}
	marker := &observed.Marker{}
	specs := map[string]reflect.Value{"marker": reflect.ValueOf(marker).Elem()}
	for name, sp := range stepParams {
		specs[name] = reflect.ValueOf(sp).Elem()
	}
	for name, v := range specs {
		fill(t, v)
		for i := range v.NumField() {
			if _, ok := decisions[name][v.Type().Field(i).Name]; !ok {
				t.Errorf("%s.%s: decide whether the JSON plan carries it (planner/json.go, jsonplan, docs/plan.schema.json, a format_version bump) and list it here",
					v.Type().Name(), v.Type().Field(i).Name)
			}
		}
	}
	order := []string{"overlay", "seed", "domain", "clone", "size"}
	var steps []planner.Step
	for _, name := range order {
		sp := stepParams[name]
		steps = append(steps, planner.Step{ID: name, Action: planner.Action(sp.Info().Name), Params: planner.Params{Plugin: sp}})
	}
	steps = append(steps, planner.Step{ID: "marker", Action: planner.ActionBind, Params: planner.Params{Marker: marker}})
	p := &planner.Plan{Changes: []planner.Change{{Machine: "m", Steps: steps}}}
	js, err := planner.MarshalJSON(p)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Changes []struct {
			Steps []struct {
				Params map[string]map[string]any `json:"params"`
			} `json:"steps"`
		} `json:"changes"`
	}
	if err := json.Unmarshal(js, &doc); err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]any{}
	for _, s := range doc.Changes[0].Steps {
		for k, v := range s.Params {
			got[k] = v
		}
	}
	for name, fields := range decisions {
		for field, key := range fields {
			if _, present := got[name][key]; key != "" && !present {
				t.Errorf("%s.%s: want it in the JSON plan as params.%s.%s; it is missing", name, field, name, key)
			}
		}
		if extra := len(got[name]) - countKeys(fields); extra != 0 {
			t.Errorf("params.%s has %d keys, the decisions list %d: %v", name, len(got[name]), countKeys(fields), got[name])
		}
	}
}

func countKeys(m map[string]string) int {
	n := 0
	for _, key := range m {
		if key != "" {
			n++
		}
	}
	return n
}

// fill sets every field of a struct to a non-zero value.
func fill(t *testing.T, v reflect.Value) {
	t.Helper()
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString("x")
		case reflect.Int, reflect.Int64:
			f.SetInt(1)
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Map:
			f.Set(reflect.MakeMap(f.Type()))
			f.SetMapIndex(reflect.ValueOf("k"), reflect.ValueOf("v"))
		case reflect.Struct:
			fill(t, f)
		default:
			t.Fatalf("fill: field %s of kind %s", v.Type().Field(i).Name, f.Kind())
		}
	}
}

// TestConfigurePlanNeverCarriesTheBlob plans a Configure whose blob (with
// a token in it) is in the document's memory and checks neither the JSON
// nor the text plan contains any of it.
func TestConfigurePlanNeverCarriesTheBlob(t *testing.T) {
	ctx := context.Background()
	secret := "#!/bin/sh\nkubeadm join --token s3cr3t.abcdef0123456789 10.0.0.1:6443\n"
	for _, pl := range []planner.Plugin{libvirt.Planner(libvirt.PlanSettings{}),
		proxmox.Planner(proxmox.PlanSettings{BootstrapPath: "/run/bigfleet-bootstrap", BootstrapExec: []string{"/bin/sh"}})} {
		t.Run(pl.Name(), func(t *testing.T) {
			now := func() time.Time { return t0 }
			doc, _, err := desired.Open(ctx, desired.Options{Store: desired.NewMemoryStore(nil), Installation: "inst", DeleteSupported: true, Now: now, VMName: naming.VMName},
				[]desired.Slot{{ID: "m1", Zone: "a", InstanceType: "t", Capacity: desired.OnDemand, VCPU: 2, MemoryMiB: 2048}})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := doc.Mutate(ctx, desired.Request{Kind: desired.KindCreate, MachineID: "m1"}); err != nil {
				t.Fatal(err)
			}
			m := doc.Get("m1")
			if _, err := doc.Complete(ctx, "m1", m.Intent.OpID, desired.Result{Host: "a/" + m.VMName}); err != nil {
				t.Fatal(err)
			}
			if _, err := doc.Mutate(ctx, desired.Request{Kind: desired.KindConfigure, MachineID: "m1", Cluster: "c1", Blob: []byte(secret),
				Metadata: map[string]string{"k": "v"}}); err != nil {
				t.Fatal(err)
			}
			m = doc.Get("m1")
			vm := &observed.VM{Zone: "a", Name: m.VMName, Power: observed.PowerRunning, VCPU: 2, MemoryMiB: 2048, Autostart: true,
				Marker: &observed.Marker{Installation: "inst", MachineID: "m1"}}
			snap := &observed.Snapshot{At: t0, Zones: map[string]*observed.Zone{"a": {Name: "a", Status: observed.StatusOK, At: t0, VMs: []*observed.VM{vm}}}}
			cfg := planner.Config{Plugin: pl, Installation: "inst"}
			p := planner.Build(planner.Inputs{Config: cfg, Machines: doc.All(), Observed: snap, Now: t0})
			if p.Summary.Configure != 1 {
				t.Fatalf("want a Configure, got %+v", p.Summary)
			}
			js, err := planner.MarshalJSON(p)
			if err != nil {
				t.Fatal(err)
			}
			var text bytes.Buffer
			if err := planner.WriteText(&text, p, planner.TextOptions{Color: true}); err != nil {
				t.Fatal(err)
			}
			for _, needle := range []string{secret, "s3cr3t", "abcdef0123456789", "kubeadm"} {
				if bytes.Contains(js, []byte(needle)) || strings.Contains(text.String(), needle) {
					t.Errorf("plan contains %q from the bootstrap blob", needle)
				}
			}
		})
	}
}
