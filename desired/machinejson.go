package desired

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
)

// A machine's record is written on every commit that changes it (twice a
// walk), so its JSON is built by appending, like a history event's
// (histjson.go): byte for byte what encoding/json writes for the same
// value, which TestMachineJSONMatchesEncodingJSON holds it to. Through
// reflection it cost some twenty allocations a record (a copy of every
// map key and value, the sort, each time's text).

// appendMachine appends m as encoding/json would encode it, and fails
// where it would: on a time outside the years 0-9999 or a price that is
// NaN or infinite.
func appendMachine(b []byte, m *Machine) ([]byte, error) {
	b = append(b, `{"id":`...)
	b = appendString(b, m.ID)
	b = append(b, `,"zone":`...)
	b = appendString(b, m.Zone)
	b = append(b, `,"instance_type":`...)
	b = appendString(b, m.InstanceType)
	b = append(b, `,"capacity":`...)
	b = appendString(b, m.Capacity)
	b = append(b, `,"vcpu":`...)
	b = strconv.AppendInt(b, int64(m.VCPU), 10)
	b = append(b, `,"memory_mib":`...)
	b = strconv.AppendInt(b, int64(m.MemoryMiB), 10)
	b = appendIntField(b, `,"template_vmid":`, m.Source)
	b = append(b, `,"price":`...)
	b, err := appendFloat(b, m.Price)
	if err != nil {
		return nil, err
	}
	b = appendMapField(b, `,"resources":`, m.Resources)
	b = appendMapField(b, `,"labels":`, m.Labels)
	if m.Slotless {
		b = append(b, `,"slotless":true`...)
	}
	b = append(b, `,"state":`...)
	b = strconv.AppendInt(b, int64(m.State), 10)
	b = append(b, `,"since":`...)
	if b, err = appendTime(b, m.Since); err != nil {
		return nil, err
	}
	b = appendField(b, `,"host":`, m.Host)
	b = appendIntField(b, `,"cycle":`, m.Cycle)
	b = appendField(b, `,"vm_name":`, m.VMName)
	b = appendIntField(b, `,"vmid":`, m.VMID)
	b = appendField(b, `,"cluster":`, m.Cluster)
	b = appendMapField(b, `,"shard_metadata":`, m.ShardMetadata)
	b = appendField(b, `,"last_error":`, m.LastError)
	if in := m.Intent; in != nil {
		b = append(b, `,"intent":{"kind":`...)
		b = appendString(b, string(in.Kind))
		b = append(b, `,"op_id":`...)
		b = appendString(b, in.OpID)
		b = append(b, `,"started":`...)
		if b, err = appendTime(b, in.Started); err != nil {
			return nil, err
		}
		b = append(b, `,"deadline":`...)
		if b, err = appendTime(b, in.Deadline); err != nil {
			return nil, err
		}
		if in.GraceSeconds != 0 {
			b = append(b, `,"grace_seconds":`...)
			b = strconv.AppendInt(b, in.GraceSeconds, 10)
		}
		if len(in.Execs) > 0 {
			b = append(b, `,"execs":[`...)
			for i, s := range in.Execs {
				if i > 0 {
					b = append(b, ',')
				}
				b = appendString(b, s)
			}
			b = append(b, ']')
		}
		b = append(b, '}')
	}
	if len(m.Ops) > 0 {
		b = append(b, `,"ops":{`...)
		var small [16]Kind
		for i, k := range appendSortedKeys(small[:0], m.Ops) {
			if i > 0 {
				b = append(b, ',')
			}
			op := m.Ops[k]
			b = appendString(b, string(k))
			b = append(b, `:{"id":`...)
			b = appendString(b, op.ID)
			b = appendField(b, `,"fp":`, op.Fingerprint)
			b = append(b, '}')
		}
		b = append(b, '}')
	}
	b = append(b, `,"rev":`...)
	b = strconv.AppendUint(b, m.Rev, 10)
	return append(b, '}'), nil
}

// appendIntField appends an omitempty int field.
func appendIntField(b []byte, name string, v int) []byte {
	if v == 0 {
		return b
	}
	return strconv.AppendInt(append(b, name...), int64(v), 10)
}

// appendMapField appends an omitempty map[string]string field, its keys
// in order as encoding/json sorts them.
func appendMapField(b []byte, name string, m map[string]string) []byte {
	if len(m) == 0 {
		return b
	}
	b = append(b, name...)
	b = append(b, '{')
	var small [16]string
	for i, k := range appendSortedKeys(small[:0], m) {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		b = appendString(b, m[k])
	}
	return append(b, '}')
}

// appendSortedKeys appends m's keys to keys and sorts them: into the
// caller's array on its stack for maps of a few keys (all the document's).
func appendSortedKeys[K ~string, V any](keys []K, m map[K]V) []K {
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// appendFloat appends f as encoding/json does (a float64: 'e' notation
// below 1e-6 and from 1e21, with a one-digit negative exponent cleaned
// up), and fails where it does: on NaN and infinities.
func appendFloat(b []byte, f float64) ([]byte, error) {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		_, err := json.Marshal(f)
		return b, err
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, nil
}
