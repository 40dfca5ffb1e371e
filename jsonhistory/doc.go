// Package jsonhistory is the published, versioned JSON form of machine
// histories: what `provider history --json` prints and the metrics
// listener's /debug/history serves. It has its own types (the desired
// document's Event is copied field by field, never embedded), one
// encoder, a decoder that checks format_version under the rule of
// docs/history-format.md (the plan's rule: a new optional field or enum
// value bumps MINOR, any change of meaning bumps MAJOR), and the text
// renderer, which reads only this form and escapes every string it prints
// that a client or a guest could have chosen.
package jsonhistory
