// Package proxmox is the acceptance suite of the Proxmox VE hypervisor
// (issue 5): it builds the provider binary once, serves the in-project
// Proxmox API simulator (pvesim) over real TLS on a loopback port inside
// the test process, and drives the binary's gRPC API, so the real
// go-proxmox client inside the binary talks HTTPS to the simulator.
//
// Invariants the tests rely on and check:
//   - The binary trusts the simulator only through --proxmox-tls-fingerprint
//     or --proxmox-ca-file; every test uses one of them, never an insecure
//     mode.
//   - Assertions read the simulator (VMs, tags, guest files and execs,
//     per-endpoint request counts) and the gRPC API, never the provider's
//     internals.
//   - The token secret never appears in the provider's output.
//   - The default run uses zero or small task latencies; measurements with
//     the simulator's default latencies are benchmarks (make bench style:
//     go test -run '^$' -bench . ./acceptance/proxmox/).
//
// The package holds no non-test code.
package proxmox
