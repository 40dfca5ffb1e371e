package desired

import (
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"
)

// History records are written on every commit that carries an event, so
// their JSON is built by appending, byte for byte what encoding/json
// writes for the same values (TestEventJSONMatchesEncodingJSON holds it
// to that): reflection and a growing buffer per event were a tenth of
// what the durable walk allocated.

// appendEvent appends ev as encoding/json would encode it, and fails
// where it would: on a time outside the years 0-9999.
func appendEvent(b []byte, ev *Event) ([]byte, error) {
	b = append(b, `{"seq":`...)
	b = strconv.AppendUint(b, ev.Seq, 10)
	b = append(b, `,"at":`...)
	b, err := appendTime(b, ev.At)
	if err != nil {
		return nil, err
	}
	b = append(b, `,"kind":`...)
	b = appendString(b, ev.Kind)
	b = appendField(b, `,"from":`, ev.From)
	b = appendField(b, `,"to":`, ev.To)
	b = appendField(b, `,"op_id":`, ev.OpID)
	b = appendField(b, `,"cause":`, ev.Cause)
	b = appendField(b, `,"action":`, ev.Action)
	b = appendField(b, `,"reason":`, ev.Reason)
	if ev.DurationMS != 0 {
		b = append(b, `,"duration_ms":`...)
		b = strconv.AppendInt(b, ev.DurationMS, 10)
	}
	b = appendField(b, `,"outcome":`, ev.Outcome)
	b = appendField(b, `,"class":`, ev.Class)
	b = appendField(b, `,"error":`, ev.Error)
	if ev.Exit != nil {
		b = append(b, `,"exit":`...)
		b = strconv.AppendInt(b, int64(*ev.Exit), 10)
	}
	return append(b, '}'), nil
}

// appendField appends an omitempty string field.
func appendField(b []byte, name, s string) []byte {
	if s == "" {
		return b
	}
	return appendString(append(b, name...), s)
}

// appendString appends s quoted. Text that encoding/json would escape
// (quotes, backslashes, control bytes, <, >, &, invalid UTF-8, U+2028 and
// U+2029) is left to it; everything else is copied as is.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' || c >= utf8.RuneSelf {
			raw, _ := json.Marshal(s) // a string: cannot fail
			return append(b, raw...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendTime appends t as time.Time's MarshalJSON does, and fails where
// it does: on a year outside 0-9999.
func appendTime(b []byte, t time.Time) ([]byte, error) {
	if y := t.Year(); y < 0 || y > 9999 {
		_, err := json.Marshal(t)
		return b, err
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"'), nil
}
