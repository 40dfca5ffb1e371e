// Package jsonplan is the published, versioned JSON form of a plan: its
// schema types, the encoder every producer uses (`provider plan --json`
// and the metrics listener's /debug/plan), the decoder that checks
// format_version, and the human renderer, which reads only this form.
//
// Invariants:
//   - The types here are the wire format. They embed no type of another
//     package, so changing an adapter's spec or the planner's internals
//     cannot change the JSON; only an edit here can, and it comes with a
//     FormatVersion bump under the rule in docs/plan-format.md and an
//     update of docs/plan.schema.json (a test validates against it).
//   - A plan is written in the lowest version that expresses it
//     (VersionFor, from the one table of the sections each minor added):
//     a plan without a later minor's section is byte for byte what it was.
//   - Decode accepts exactly the plans this build can read in full: the
//     same major version; for a minor at or below FormatVersion's every
//     field must be known and no section of a later minor may appear; a
//     newer minor may add fields, which are ignored.
//   - The renderer prints nothing the JSON does not carry.
//   - A plan never carries the bootstrap blob or a token.
package jsonplan
