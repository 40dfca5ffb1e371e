package termtext

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// Escape returns s as it is when every rune is printable, and otherwise
// quoted (Go syntax), so no client-chosen text can move the cursor, colour
// the terminal or forge a line; a quoted string stays distinguishable from
// one that merely contains a backslash.
func Escape(s string) string {
	if !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// Stamp is t in UTC, RFC 3339, or "-" for the zero time.
func Stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
