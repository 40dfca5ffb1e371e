package jsonhistory

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/bigfleet-vm/provider/jsonplan"
)

// FormatVersion is the version this build writes, "MAJOR.MINOR"; the rule
// is the plan's (docs/history-format.md). docs/history.schema.json
// describes exactly this version.
const FormatVersion = "1.0"

// MaxEvents bounds the events one document carries; a fleet timeline
// with more says Truncated and keeps the newest.
const MaxEvents = 10000

// History is the document.
type History struct {
	FormatVersion string    `json:"format_version"`
	GeneratedAt   time.Time `json:"generated_at"`
	Query         Query     `json:"query"`
	Machines      []Machine `json:"machines"`
	// Truncated says older events were left out to stay within MaxEvents.
	Truncated bool `json:"truncated,omitempty"`
}

// Query is what was asked: one machine, or a fleet timeline.
type Query struct {
	Machine string     `json:"machine,omitempty"`
	Since   *time.Time `json:"since,omitempty"`
	Zone    string     `json:"zone,omitempty"`
	State   string     `json:"state,omitempty"`
}

// Machine is one machine's history.
type Machine struct {
	ID   string `json:"id"`
	Zone string `json:"zone"`
	// State is the committed state; DELETED for a machine that left the
	// document (Deleted says when).
	State   string     `json:"state"`
	Deleted *time.Time `json:"deleted,omitempty"`
	Events  []Event    `json:"events"`
}

// Event is one entry; Kind says which fields it carries.
type Event struct {
	Seq        uint64    `json:"seq"`
	At         time.Time `json:"at"`
	Kind       string    `json:"kind"`
	From       string    `json:"from,omitempty"`
	To         string    `json:"to,omitempty"`
	OpID       string    `json:"op_id,omitempty"`
	Cause      string    `json:"cause,omitempty"`
	Action     string    `json:"action,omitempty"`
	Reason     string    `json:"reason,omitempty"`
	DurationMS int64     `json:"duration_ms,omitempty"`
	Outcome    string    `json:"outcome,omitempty"`
	Class      string    `json:"class,omitempty"`
	Error      string    `json:"error,omitempty"`
	Exit       *int      `json:"exit,omitempty"`
}

// Marshal is the one encoder.
func Marshal(h *History) ([]byte, error) {
	h.FormatVersion = FormatVersion
	if h.Machines == nil {
		h.Machines = []Machine{}
	}
	for i := range h.Machines {
		if h.Machines[i].Events == nil {
			h.Machines[i].Events = []Event{}
		}
	}
	b, err := json.MarshalIndent(h, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode history: %w", err)
	}
	return append(b, '\n'), nil
}

// Decode reads a history document: refused without a well-formed
// format_version or of another major; strict on fields up to this build's
// minor, a newer minor's additions ignored.
func Decode(raw []byte) (*History, error) {
	var head struct {
		FormatVersion *string `json:"format_version"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, fmt.Errorf("decode history: %w", err)
	}
	if head.FormatVersion == nil {
		return nil, errors.New("decode history: no format_version: not a history document")
	}
	major, minor, err := jsonplan.ParseVersion(*head.FormatVersion)
	if err != nil {
		return nil, fmt.Errorf("decode history: %w", err)
	}
	myMajor, myMinor, _ := jsonplan.ParseVersion(FormatVersion)
	if major != myMajor {
		return nil, fmt.Errorf("decode history: format_version %s is not supported (this build reads %d.x, up to %s)", *head.FormatVersion, myMajor, FormatVersion)
	}
	var h History
	dec := json.NewDecoder(bytes.NewReader(raw))
	if minor <= myMinor {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(&h); err != nil {
		msg := err.Error()
		if len(msg) > 200 {
			msg = msg[:200] + "..."
		}
		return nil, fmt.Errorf("decode history (format_version %s): %s", *head.FormatVersion, msg)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("decode history: data after the document")
	}
	return &h, nil
}
