// Package metrics defines the provider's Prometheus metrics under one
// prefix, bigfleet_provider_, with low-cardinality labels only (zone,
// instance type, state, action, kind, method, code; never a machine id).
//
// Invariants: every method is safe on a nil *Metrics (metrics disabled),
// and machine gauges are computed at scrape time from the desired document,
// so they can never drift from what Get/List report.
package metrics
