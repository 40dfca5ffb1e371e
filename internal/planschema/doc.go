// Package planschema validates JSON plans against the published schema,
// docs/plan.schema.json, with a real JSON Schema (2020-12) validator. It
// is imported by tests only.
//
// Invariants:
//   - The schema is read from the repository's docs/, the file operators
//     are pointed at, never from a copy.
//   - Formats (date-time) are asserted, not only annotated.
package planschema
