package desired

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Caps on what a client may send. Above them a mutation answers
// InvalidArgument (ResourceExhausted for the fence budgets) and nothing
// changes; nothing is ever truncated. docs/operations.md lists them.
const (
	// MaxIDBytes caps machine_id, shard_id and cluster_id.
	MaxIDBytes = 256
	// MaxBlobBytes caps the bootstrap blob.
	MaxBlobBytes = 8 << 20
	// MaxMetadataEntries and MaxMetadataBytes (keys plus values) cap
	// shard_metadata.
	MaxMetadataEntries = 128
	MaxMetadataBytes   = 64 << 10
	// MaxGraceSeconds is the longest drain grace period honoured; a longer
	// one is treated as this (one day), so deadlines never overflow.
	MaxGraceSeconds = 24 * 60 * 60
	// MaxFencesPerMachine bounds the shards holding a fence mark on one
	// machine; a further shard's first contact is refused.
	MaxFencesPerMachine = 64
	// MaxUnknownFences bounds the fence marks kept for machine ids that do
	// not exist (any client can name arbitrary ids).
	MaxUnknownFences = 65536
	// MaxFenceBytes bounds the bytes of shard and machine ids held in
	// fence marks overall.
	MaxFenceBytes = 64 << 20

	maxLastErrorBytes = 2048
	// maxEcho bounds how much of a client's string an error repeats.
	maxEcho = 64
)

// Clip returns s cut to at most n bytes (on a rune boundary) with a
// marker saying how long it was, quoted so control bytes stay visible: the
// one way this project echoes client input in errors and logs.
func Clip(s string, n int) string {
	if len(s) <= n {
		return strconv.Quote(s)
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + "…(" + strconv.Itoa(len(s)) + " bytes)"
}

// clipText bounds s to n bytes at a rune boundary (plus a "…" marker
// when cut) and makes it valid UTF-8: how the document stores text it did
// not choose (a last_error, a history event's texts).
func clipText(s string, n int) string {
	s = strings.ToValidUTF8(s, "\ufffd")
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// checkString validates one client string: valid UTF-8, non-empty if
// required, at most max bytes. field names it in the error.
func checkString(field, s string, required bool, max int) *Error {
	switch {
	case required && s == "":
		return errorf(CodeInvalid, "%s is empty", field)
	case len(s) > max:
		return errorf(CodeInvalid, "%s is %d bytes; the cap is %d", field, len(s), max)
	case !utf8.ValidString(s):
		return errorf(CodeInvalid, "%s %s is not valid UTF-8", field, Clip(s, maxEcho))
	}
	return nil
}

func checkMetadata(md map[string]string) *Error {
	if len(md) > MaxMetadataEntries {
		return errorf(CodeInvalid, "shard_metadata has %d entries; the cap is %d", len(md), MaxMetadataEntries)
	}
	total := 0
	for k, v := range md {
		total += len(k) + len(v)
	}
	if total > MaxMetadataBytes {
		return errorf(CodeInvalid, "shard_metadata holds %d bytes of keys and values; the cap is %d", total, MaxMetadataBytes)
	}
	for k, v := range md {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return errorf(CodeInvalid, "shard_metadata entry %s is not valid UTF-8 (proto3 map<string,string> carries UTF-8 text; encode binary values, e.g. base64)", Clip(k, maxEcho))
		}
	}
	return nil
}

// CheckID validates an id a reader names (Get's MachineRef.id): non-empty,
// valid UTF-8, at most MaxIDBytes.
func CheckID(field, id string) error {
	if err := checkString(field, id, true, MaxIDBytes); err != nil {
		return err
	}
	return nil
}
