// Package soak is the churn soak of the libvirt provider (make soak): the
// real binary against a real libvirtd with real tiny guests, one zone per
// transport (unix socket, qemu+tls through a relay, qemu+libssh,
// qemu+ssh), parallel workers walking machines through Create, Configure,
// Drain and Delete while a chaos loop restarts libvirtd, cuts and freezes
// the TLS path, kills ssh sessions and kill -9s the provider.
//
// It fails on any libvirt call that overran its deadline, a machine stuck
// in a transition past its timeout, an acknowledged mutation lost, two
// domains for one machine, a domain or volume left at the end, provider
// RSS or goroutines growing after warm-up, or an offline `provider plan`
// that reports a healthy zone unknown; it prints cycles, calls by
// procedure (p50/p99/max), chaos events survived, RSS and goroutines.
//
// The test is behind the soak build tag; scripts/soak.sh brings up the
// substrate (scripts/libvirt-up.sh, scripts/sshd-up.sh) and runs it for
// SOAK_DURATION (default 4m) with SOAK_WORKERS workers (default 4).
package soak
