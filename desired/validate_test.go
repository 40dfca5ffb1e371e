package desired

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/naming"
)

// TestImpossibleRecordsAreRefused: a stored machine record holding a value
// the document never writes (issue 17: a state of 99 written into etcd
// was served) fails Open and Inspect with an error naming the key and the
// value, whatever store it came from.
func TestImpossibleRecordsAreRefused(t *testing.T) {
	const id = "z1/kvm.small/000"
	key := keyMachine + id
	base := func(t *testing.T) map[string][]byte {
		store := NewMemoryStore(nil)
		d := open(t, store, slots(2))
		if _, err := mut(t, d, Request{Kind: KindCreate, MachineID: id}); err != nil {
			t.Fatal(err)
		}
		return snapshot(t, store)
	}
	// edit rewrites the machine record through a generic map, as a foreign
	// writer would.
	edit := func(f func(m map[string]any)) func(map[string][]byte) {
		return func(stored map[string][]byte) {
			var m map[string]any
			if err := json.Unmarshal(stored[key], &m); err != nil {
				panic(err)
			}
			f(m)
			raw, err := json.Marshal(m)
			if err != nil {
				panic(err)
			}
			stored[key] = raw
		}
	}
	for _, tc := range []struct {
		name   string
		damage func(map[string][]byte)
		want   string
	}{
		{"state 99", edit(func(m map[string]any) { m["state"] = 99 }), "state 99 is not a machine state"},
		{"state 0", edit(func(m map[string]any) { m["state"] = 0 }), "state 0 is not a machine state"},
		{"transitional without intent", edit(func(m map[string]any) { delete(m, "intent") }), "state CREATING without an intent"},
		{"intent in a settled state", edit(func(m map[string]any) { m["state"] = int(Idle) }), `a "create" intent in settled state IDLE`},
		{"intent of another kind", edit(func(m map[string]any) { m["intent"].(map[string]any)["kind"] = "drain" }), `a "drain" intent in state CREATING`},
		{"intent of an unknown kind", edit(func(m map[string]any) { m["intent"].(map[string]any)["kind"] = "explode" }), `a "explode" intent in state CREATING`},
		{"intent without op id", edit(func(m map[string]any) { m["intent"].(map[string]any)["op_id"] = "" }), "create intent without an operation id"},
		{"id of another machine", edit(func(m map[string]any) { m["id"] = "z1/kvm.small/001" }), `holds machine id "z1/kvm.small/001"`},
		{"negative vcpu", edit(func(m map[string]any) { m["vcpu"] = -1 }), "negative size"},
		{"negative price", edit(func(m map[string]any) { m["price"] = -0.5 }), "price -0.5 is not a price"},
		{"unknown capacity", edit(func(m map[string]any) { m["capacity"] = "spot" }), `capacity "spot" is not`},
		{"revision 0", edit(func(m map[string]any) { m["rev"] = 0 }), "revision 0"},
		{"unknown op kind", edit(func(m map[string]any) { m["ops"] = map[string]any{"explode": map[string]any{"id": "op-1"}} }), `operation record for unknown kind "explode"`},
		{"oversized last error", edit(func(m map[string]any) { m["last_error"] = strings.Repeat("x", 20000) }), "last error of 20000 bytes"},
		{"not JSON", func(stored map[string][]byte) { stored[key] = []byte("{") }, "decode machine"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stored := base(t)
			tc.damage(stored)
			opts := Options{Store: NewMemoryStore(stored), DefaultInstallation: "inst", DeleteSupported: true,
				Now: func() time.Time { return t0 }, VMName: naming.VMName}
			if _, _, err := Open(context.Background(), opts, slots(2)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Open = %v, want an error saying %q", err, tc.want)
			} else if !strings.Contains(err.Error(), id) {
				t.Errorf("Open = %v, want the key named", err)
			}
			if _, err := Inspect(stored, opts, slots(2)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Inspect = %v, want an error saying %q", err, tc.want)
			}
		})
	}
	// The undamaged document opens: the checks refuse nothing it writes.
	stored := base(t)
	if _, _, err := Open(context.Background(), Options{Store: NewMemoryStore(stored), DefaultInstallation: "inst", DeleteSupported: true,
		Now: func() time.Time { return t0 }, VMName: naming.VMName}, slots(2)); err != nil {
		t.Fatalf("undamaged document: %v", err)
	}
}

// TestFailedReasonIsEchoedEscaped (issue 17, item 4): the refusal of a
// mutation on a FAILED machine repeats its last_error, which may hold a
// hook's output; control characters in it are echoed escaped.
func TestFailedReasonIsEchoedEscaped(t *testing.T) {
	d := open(t, NewMemoryStore(nil), slots(1))
	id := "z1/kvm.small/000"
	if _, err := d.Fail(context.Background(), id, "", "hook said \x1b[2J\x1b[31mall good\r\n"); err != nil {
		t.Fatal(err)
	}
	_, err := mut(t, d, Request{Kind: KindCreate, MachineID: id})
	if code(err) != CodeConflict {
		t.Fatalf("create on a FAILED machine: %v", err)
	}
	if msg := err.Error(); strings.ContainsAny(msg, "\x1b\r\n") || !strings.Contains(msg, `"hook said \x1b[2J\x1b[31mall good\r\n"`) {
		t.Errorf("refusal = %q, want the reason quoted", msg)
	}
}

// TestAdoptRefusesWhatLoadWouldRefuse (issue 17: a non-UTF-8 VM name from
// the simulator's admin endpoint made every List answer Internal and the
// state unreadable afterwards): an adoption carrying a string the load
// checks refuse is not recorded, and the document still opens.
func TestAdoptRefusesWhatLoadWouldRefuse(t *testing.T) {
	const id = "z1/kvm.small/000"
	for _, tc := range []struct {
		name string
		a    Adoption
	}{
		{"vm name not UTF-8", Adoption{MachineID: id, Zone: "z1", Host: "h", VMName: "bf-\xff\xfe"}},
		{"host not UTF-8", Adoption{MachineID: id, Zone: "z1", Host: "h\xc3", VMName: "vm"}},
		{"vm name oversized", Adoption{MachineID: id, Zone: "z1", Host: "h", VMName: strings.Repeat("v", maxStoredString+1)}},
		{"slotless, zone not UTF-8", Adoption{MachineID: "z9/kvm.small/000", Zone: "z9\xff", Host: "h", VMName: "vm"}},
		{"slotless, type not UTF-8", Adoption{MachineID: "z9/kvm.small/000", Zone: "z9", InstanceType: "kvm\xff", Host: "h", VMName: "vm"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := NewMemoryStore(nil)
			d := open(t, store, slots(2))
			ok, err := d.Adopt(context.Background(), tc.a)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				t.Errorf("Adopt = true, want the adoption refused")
			}
			opts := Options{Store: NewMemoryStore(snapshot(t, store)), DefaultInstallation: "inst", DeleteSupported: true,
				Now: func() time.Time { return t0 }, VMName: naming.VMName}
			if _, _, err := Open(context.Background(), opts, slots(2)); err != nil {
				t.Errorf("the document no longer opens after the adoption: %v", err)
			}
		})
	}
	// A clean adoption is still recorded.
	d := open(t, NewMemoryStore(nil), slots(2))
	if ok, err := d.Adopt(context.Background(), Adoption{MachineID: id, Zone: "z1", Host: "h", VMName: "vm"}); err != nil || !ok {
		t.Errorf("clean Adopt = %v, %v; want true", ok, err)
	}
}
