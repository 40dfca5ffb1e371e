// Package version says which build of the provider is running: the
// version stamped at link time by `make build`, else what the Go
// toolchain recorded about the build (module version or VCS revision),
// else "dev".
//
// Invariants: String never returns "" and never changes while the process
// runs; it is what `provider version` prints and what the
// bigfleet_provider_build_info metric carries in its version label.
package version
