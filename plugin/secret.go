package plugin

import (
	"fmt"
	"io"
	"log/slog"
)

// Secret holds a credential. Every way of printing it — fmt verbs
// including %#v, JSON, text marshalling and slog — yields "[redacted]";
// only Reveal returns the value.
type Secret string

const redacted = "[redacted]"

// Reveal returns the secret itself, for the one place that must send it.
func (s Secret) Reveal() string { return string(s) }

// String implements fmt.Stringer.
func (s Secret) String() string { return redacted }

// GoString implements fmt.GoStringer.
func (s Secret) GoString() string { return redacted }

// Format implements fmt.Formatter so that no verb prints the value.
func (s Secret) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, redacted) }

// MarshalText implements encoding.TextMarshaler (and so JSON).
func (s Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// LogValue implements slog.LogValuer.
func (s Secret) LogValue() slog.Value { return slog.StringValue(redacted) }
