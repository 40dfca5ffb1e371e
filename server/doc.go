// Package server assembles and runs the provider from a validated
// config.Config: state store, desired document, hypervisor, executor,
// reconciler, the gRPC API and the metrics/health/debug HTTP listener.
//
// Invariants:
//   - Nothing listens before every dependency is built and the state is
//     recovered; a startup failure exits non-zero before listening.
//   - /readyz is green only while gRPC serves and the state store is
//     healthy.
//   - A graceful stop refuses new mutations (UNAVAILABLE) and reports
//     NOT_SERVING at once, keeps answering reads, finishes the queued and
//     in-flight work within --shutdown-grace, then stops gRPC and flushes
//     the state store.
//   - The metrics listener is best effort on its default address: a bind
//     failure is logged and reported as NOT_SERVING on the gRPC health
//     service MetricsHealthService, and gRPC serves on. An explicit
//     --metrics-addr that cannot be bound fails the start.
//   - The /admin/ endpoints change the simulated world only on the
//     simulator with --fake-admin, through the hypervisors.Simulator
//     capability.
//   - server opens the hypervisor the configuration resolved
//     (config.Config.Plugin) and imports no hypervisor implementation.
//   - What a gRPC client can hold is bounded (limits.go): connections
//     (one beyond MaxConnections is closed on accept), streams per
//     connection, request headers, keepalive; a closed connection gives
//     its queued List answers back to the service's bound.
//   - A file state whose files are removed under the running provider
//     stops it (exit non-zero) without finishing in-flight work.
//   - A replica of an etcd state that cannot open it backs off
//     (retry.Takeover) and says why on /readyz.
package server
