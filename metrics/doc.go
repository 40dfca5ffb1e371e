// Package metrics defines the provider's Prometheus metrics under one
// prefix, bigfleet_provider_, with low-cardinality labels only (zone,
// instance type, state, action, kind, op, outcome; never a machine id),
// plus the standard gRPC server metrics of go-grpc-middleware
// (grpc_server_handled_total, grpc_server_handling_seconds, ...) that
// every gRPC dashboard understands.
//
// Invariants: every method is safe on a nil *Metrics (metrics disabled),
// and machine gauges and state-store health are computed at scrape time
// from the desired document, so they can never drift from what Get/List
// and /readyz report. Only the serving replica exports the series of the
// desired state (zones, drift, plan, observations, machines): each term
// feeds its own Term, and only the one Serve names is exported, while its
// guard holds; bigfleet_provider_serving says whether this replica is it.
// The drift and plan families of one scrape come from one immutable
// planner.Totals.
package metrics
