// Package providertest holds what every black-box suite of the provider
// needs: the binary built once per test package, free loopback ports, a
// readiness wait and a goroutine-safe log buffer. It is imported by tests
// only.
package providertest
