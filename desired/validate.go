package desired

import (
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// Stored records are checked when they are read back (decode, so Open and
// Inspect), whichever store they come from: a value the document never
// writes (a state of 99, an intent that does not match its state, a
// string the wire cannot carry) is refused with an error naming the key,
// never served. The checks are the invariants every writer of this
// package keeps; they are deliberately no stricter, so any document this
// release or the previous one wrote passes.

// maxStoredString bounds any stored string: the longest the document
// writes is a last_error (maxLastErrorBytes plus a marker) or a host ref
// built from ids and names; a stored value far beyond is damage.
const maxStoredString = 16 << 10

// validMachine reports why a machine decoded from key is not one the
// document could have written, nil if it is.
func validMachine(key string, m *Machine) error {
	if id := strings.TrimPrefix(key, keyMachine); m.ID != id {
		return fmt.Errorf("holds machine id %s", Clip(m.ID, maxEcho))
	}
	if err := checkString("machine id", m.ID, true, MaxIDBytes); err != nil {
		return err
	}
	if _, ok := stateNames[m.State]; !ok {
		return fmt.Errorf("state %d is not a machine state", m.State)
	}
	switch m.Capacity {
	case "", OnDemand, BareMetal:
	default:
		return fmt.Errorf("capacity %s is not %s or %s", Clip(m.Capacity, maxEcho), OnDemand, BareMetal)
	}
	switch {
	case m.VCPU < 0 || m.MemoryMiB < 0 || m.Source < 0 || m.VMID < 0 || m.Cycle < 0:
		return fmt.Errorf("negative size, id or cycle (vcpu %d, memory %d MiB, source %d, vmid %d, cycle %d)", m.VCPU, m.MemoryMiB, m.Source, m.VMID, m.Cycle)
	case math.IsNaN(m.Price) || math.IsInf(m.Price, 0) || m.Price < 0:
		return fmt.Errorf("price %v is not a price", m.Price)
	case m.Rev == 0:
		return fmt.Errorf("revision 0")
	}
	// Arrays, not map literals: a takeover validates every record, and a
	// map per record was most of what validating cost.
	for _, f := range [...]struct{ name, s string }{{"zone", m.Zone}, {"instance type", m.InstanceType}, {"host", m.Host},
		{"vm name", m.VMName}, {"cluster", m.Cluster}, {"last error", m.LastError}} {
		if err := storedString(f.name, f.s); err != nil {
			return err
		}
	}
	for _, f := range [...]struct {
		name string
		md   map[string]string
	}{{"resources", m.Resources}, {"labels", m.Labels}, {"shard metadata", m.ShardMetadata}} {
		for k, v := range f.md {
			if err := storedString(f.name+" key", k); err != nil {
				return err
			}
			if err := storedString(f.name+" value", v); err != nil {
				return err
			}
		}
	}
	for k, rec := range m.Ops {
		if !validKind(k) {
			return fmt.Errorf("operation record for unknown kind %s", Clip(string(k), maxEcho))
		}
		if rec.ID == "" {
			return fmt.Errorf("%s operation record without an id", k)
		}
	}
	in := m.Intent
	switch {
	case in == nil && m.State.Transitional():
		return fmt.Errorf("state %s without an intent", m.State)
	case in == nil:
		return nil
	case !m.State.Transitional():
		return fmt.Errorf("a %s intent in settled state %s", Clip(string(in.Kind), maxEcho), m.State)
	case !validKind(in.Kind) || transitionState[in.Kind] != m.State:
		return fmt.Errorf("a %s intent in state %s", Clip(string(in.Kind), maxEcho), m.State)
	case in.OpID == "":
		return fmt.Errorf("%s intent without an operation id", in.Kind)
	case in.GraceSeconds < 0 || in.GraceSeconds > MaxGraceSeconds:
		return fmt.Errorf("drain grace %d s outside 0..%d", in.GraceSeconds, MaxGraceSeconds)
	}
	return nil
}

// transitionState is the state a transition of each kind runs in.
var transitionState = map[Kind]State{KindCreate: Creating, KindConfigure: Configuring, KindDrain: Draining, KindDelete: Deleting}

func validKind(k Kind) bool {
	_, ok := transitionState[k]
	return ok
}

// storedString checks a string read back from the store: valid UTF-8 (the
// wire cannot carry anything else) and of a plausible length.
func storedString(field, s string) error {
	switch {
	case len(s) > maxStoredString:
		return fmt.Errorf("%s of %d bytes", field, len(s))
	case !utf8.ValidString(s):
		return fmt.Errorf("%s %s is not valid UTF-8", field, Clip(s, maxEcho))
	}
	return nil
}
