// Package guesttest is the one test suite of the guest-command protocol
// (package guest), run by each adapter's tests against its own transport:
// libvirt's QGA passthrough over a simulated qemu-ga, and Proxmox's agent
// endpoints over the pvesim HTTP simulator with the real go-proxmox
// client. Both run the same guest (guestsim) and the same faults, named
// by what they do to one wire call, so the at-most-once rule is checked
// at every call of every guest step on both wires.
//
// Invariants: the suite starts its own simulated guests and servers per
// subtest and leaves nothing behind; each transport names its faults by
// Class, so the expected outcome of a fault at a call is the same on every
// wire.
package guesttest
