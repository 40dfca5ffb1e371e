// Package guestsim simulates a guest as its agent sees it: files, the
// processes the agent started (forgotten once their exit was reported, as
// qemu-ga does), a boot that a reboot ends, the helper scripts of package
// guest, and programs the embedder defines. The fake hypervisors, the
// Proxmox API simulator (pvesim) and the libvirt adapter's tests all run
// their guests on it; QGA answers qemu-ga's JSON protocol for a Guest, as
// libvirt's agent passthrough carries it.
//
// Invariants callers may rely on:
//   - Honest, not scripted: a command's effects happen when it starts (or
//     at its end, for a program with Exit), whether or not anyone hears
//     the answer; an agent restart forgets pids but not processes; a
//     reboot kills processes and empties /run and /tmp.
//   - Bounded: the agent keeps at most maxProcs processes and the start
//     log at most maxExecs entries.
//   - A saved State never holds file contents (they may be the bootstrap
//     blob): only modes, SHA-256 sums and sizes.
//   - All methods are safe for concurrent use; programs run with the
//     guest locked and must not call back into it except through Proc.
package guestsim
