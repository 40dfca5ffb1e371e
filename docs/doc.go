// Package docs holds the operator documentation (the Markdown pages in
// this directory) and the tests that check it against the code.
//
// Invariants the tests keep: every flag table matches `provider serve -h`
// (names and defaults, and each configuration page lists every flag of its
// hypervisor); every shell block marked ```sh {runnable} runs and succeeds
// against the real binary; the Proxmox token privileges documented in
// security.md and host-setup.md are exactly what the adapter's preflight
// requires. The package has no code of its own.
package docs
