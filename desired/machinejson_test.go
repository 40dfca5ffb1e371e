package desired

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The appended JSON of a machine record is byte for byte encoding/json's:
// state files of earlier releases and of this one read the same. Random
// machines cover every field set and unset, maps of more keys than sort
// on the stack, texts that need escaping, times in other zones and floats
// in both notations.
func TestMachineJSONMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	alphabet := []rune("aZ09 -_:/.\"\\<>&\n\t\x01é✓\u2028")
	text := func() string {
		var b strings.Builder
		for range rng.IntN(12) {
			b.WriteRune(alphabet[rng.IntN(len(alphabet))])
		}
		if rng.IntN(20) == 0 {
			b.WriteString("bad \xff")
		}
		return b.String()
	}
	strMap := func() map[string]string {
		switch rng.IntN(4) {
		case 0:
			return nil
		case 1:
			return map[string]string{}
		}
		m := map[string]string{}
		for range rng.IntN(30) {
			m[text()] = text()
		}
		return m
	}
	when := func() time.Time {
		switch rng.IntN(4) {
		case 0:
			return time.Time{}
		case 1:
			return time.Unix(rng.Int64N(4e9), rng.Int64N(1e9)).In(time.FixedZone("x", rng.IntN(50000)-25000))
		}
		return time.Unix(rng.Int64N(4e9), rng.Int64N(1e9)).UTC()
	}
	floats := []float64{0, math.Copysign(0, -1), 0.0092, 1.5, 123456789.25, 1e-7, 2.5e-9, 1e21, 3e300, -4e-100, 1e20, 0.000001}
	num := func() int {
		if rng.IntN(3) == 0 {
			return 0
		}
		return rng.IntN(1<<20) - 1<<19
	}
	machines := []*Machine{{}}
	for range 2000 {
		m := &Machine{ID: text(), Zone: text(), InstanceType: text(), Capacity: text(), VCPU: num(), MemoryMiB: num(),
			Source: num(), Price: floats[rng.IntN(len(floats))], Resources: strMap(), Labels: strMap(), Slotless: rng.IntN(2) == 0,
			State: State(rng.IntN(10) - 1), Since: when(), Host: text(), Cycle: num(), VMName: text(), VMID: num(), Cluster: text(),
			ShardMetadata: strMap(), LastError: text(), Rev: rng.Uint64()}
		if rng.IntN(2) == 0 {
			m.Intent = &Intent{Kind: Kind(text()), OpID: text(), Started: when(), Deadline: when(), GraceSeconds: int64(num())}
			for range rng.IntN(4) {
				m.Intent.Execs = append(m.Intent.Execs, text())
			}
			if rng.IntN(4) == 0 {
				m.Intent.Execs = []string{}
			}
		}
		switch rng.IntN(3) {
		case 0:
		case 1:
			m.Ops = map[Kind]OpRecord{}
		default:
			m.Ops = map[Kind]OpRecord{}
			for range rng.IntN(20) {
				m.Ops[Kind(text())] = OpRecord{ID: text(), Fingerprint: text()}
			}
		}
		machines = append(machines, m)
	}
	for i, m := range machines {
		want, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := appendMachine([]byte("prefix"), m)
		if err != nil {
			t.Fatalf("machine %d: %v", i, err)
		}
		if !bytes.Equal(got, append([]byte("prefix"), want...)) {
			t.Fatalf("machine %d:\n got %s\nwant prefix%s", i, got, want)
		}
	}
	// Where encoding/json fails, so does appendMachine.
	for name, m := range map[string]*Machine{
		"NaN price":    {Price: math.NaN()},
		"inf price":    {Price: math.Inf(-1)},
		"since 10000":  {Since: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		"deadline -1":  {Intent: &Intent{Deadline: time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)}},
		"started 1e4y": {Intent: &Intent{Started: time.Date(10001, 1, 1, 0, 0, 0, 0, time.UTC)}},
	} {
		if _, jerr := json.Marshal(m); jerr == nil {
			t.Fatalf("%s: encoding/json does not fail", name)
		}
		if _, err := appendMachine(nil, m); err == nil {
			t.Errorf("%s: appendMachine does not fail", name)
		}
	}
}

// A field added to Machine, Intent or OpRecord must be taught to
// appendMachine, or the state file would silently lose it: a machine with
// every field set (by reflection, so a new field is set too) encodes as
// encoding/json encodes it.
func TestMachineJSONKnowsEveryField(t *testing.T) {
	var m Machine
	fillAll(t, reflect.ValueOf(&m).Elem(), "Machine")
	want, err := json.Marshal(&m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := appendMachine(nil, &m)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("appendMachine misses a field:\n got %s\nwant %s", got, want)
	}
}

// fillAll sets every exported field of struct v to a value that is not
// its zero value, and fails on a kind it does not know.
func fillAll(t *testing.T, v reflect.Value, path string) {
	t.Helper()
	if v.Type() == reflect.TypeOf(time.Time{}) {
		v.Set(reflect.ValueOf(time.Date(2026, 12, 4, 1, 2, 3, 4, time.UTC)))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString("x\"é")
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(7)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1.5)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fillAll(t, v.Elem(), path)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fillAll(t, v.Index(0), path+"[0]")
	case reflect.Map:
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fillAll(t, k, path+" key")
		fillAll(t, e, path+" value")
		v.Set(reflect.MakeMap(v.Type()))
		v.SetMapIndex(k, e)
	case reflect.Struct:
		for i := range v.NumField() {
			if f := v.Type().Field(i); f.IsExported() {
				fillAll(t, v.Field(i), path+"."+f.Name)
			}
		}
	default:
		t.Fatalf("%s: kind %s unknown to this test (and perhaps to appendMachine)", path, v.Kind())
	}
}
