//go:build integration

// Package libvirt holds the acceptance suite of issue 4: it builds the
// provider binary, starts it as a subprocess against the real libvirtd that
// scripts/libvirt-up.sh brings up, and drives it only through its gRPC API
// and its metrics listener, checking the result on the host with virsh,
// qemu-img and the guest agent of the tiny TCG guest.
//
// Invariants the suite keeps (and other suites sharing the daemon may rely
// on):
//   - Every provider it starts has its own installation id ("acc-" plus
//     random hex), so every domain and volume it makes is named
//     "bf-<installation>-..." and is swept by that prefix when a test ends,
//     whether it passed or not. Nothing outside that prefix is touched.
//   - Without the substrate (env from scripts/libvirt-up.sh, a daemon that
//     answers) it skips on a developer machine and fails when CI=true.
//   - The only test that stops libvirtd (TestDaemonRestart) is not parallel,
//     so no other test of this package runs while the daemon is down, and it
//     restarts the daemon even when it fails.
package libvirt
