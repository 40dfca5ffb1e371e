package simcore

import (
	"context"
	"os"

	"github.com/bigfleet-vm/provider/hypervisors"
)

// Surface is the part of a simulator's API that is the core's as it is:
// the calls every simulator answers the same way for its zones (closing,
// hooks, reachability, health, call counts, capacity, the guest agent and
// the simulated guest). A simulator embeds it, made with NewSurface, and
// writes only what is its own; a method of its own of the same name wins.
type Surface struct {
	core  *Core
	zones *[]string // the simulator's zones, which its Open may extend
}

// NewSurface returns c's calls for the zones *zones holds (read at each
// call, so zones added when a persisted world is loaded count).
func NewSurface(c *Core, zones *[]string) Surface { return Surface{core: c, zones: zones} }

// Zones returns the simulated zones.
func (s Surface) Zones() []string { return append([]string(nil), (*s.zones)...) }

// Close waits for background work (tasks, guest commands) and flushes
// persistence. Calls after Close fail with ErrUnreachable.
func (s Surface) Close() error { return s.core.Close() }

// SetHook replaces the per-call hook (nil removes it); safe at any time.
func (s Surface) SetHook(h Hook) { s.core.SetHook(h) }

// SetUnreachable makes every call on zone fail with ErrUnreachable (on)
// or restores it.
func (s Surface) SetUnreachable(zone string, on bool) { s.core.SetUnreachable(zone, on) }

// SetFlaky makes every call op (one of FlakyOps) on zone fail with
// ErrTransient after the usual latency (on), as a flapping host answers a
// call it cannot complete with a timeout, or restores it; the zone's
// other calls are unaffected. An unknown op or zone is an ErrInvalid
// error, so the set stays bounded by zones times ops.
func (s Surface) SetFlaky(zone, op string, on bool) error {
	return s.core.SetFlaky(*s.zones, zone, op, on)
}

// ZoneHealth implements hypervisors.HealthReporter.
func (s Surface) ZoneHealth() map[string]error { return s.core.ZoneHealth(*s.zones) }

// Calls returns how many times each operation was called.
func (s Surface) Calls() map[string]int { return s.core.Calls() }

// ResetCalls zeroes the call counters.
func (s Surface) ResetCalls() { s.core.ResetCalls() }

// ReadCapacity implements hypervisors.CapacityReader with the configured
// host (Options.Host, Options.Hosts).
func (s Surface) ReadCapacity(ctx context.Context, zone string) (hypervisors.HostCapacity, error) {
	return s.core.ReadCapacity(ctx, *s.zones, zone)
}

// AgentPing returns ErrAgentNotReady unless the VM has been running for
// Options.AgentDelay.
func (s Surface) AgentPing(ctx context.Context, t hypervisors.Target) error {
	return s.core.AgentPing(ctx, t)
}

// AgentExec runs argv in the simulated guest at most once (see the
// package doc).
func (s Surface) AgentExec(ctx context.Context, t hypervisors.Target, argv []string) (hypervisors.ExecResult, error) {
	return s.core.AgentExec(ctx, t, argv)
}

// AgentWriteFile writes a file in the simulated guest.
func (s Surface) AgentWriteFile(ctx context.Context, t hypervisors.Target, path string, data []byte, mode os.FileMode) error {
	return s.core.AgentWriteFile(ctx, t, path, data, mode)
}

// AgentRemoveFile deletes a file in the simulated guest; a missing file
// is success.
func (s Surface) AgentRemoveFile(ctx context.Context, t hypervisors.Target, path string) error {
	return s.core.AgentRemoveFile(ctx, t, path)
}

// Guest returns a copy of a VM's simulated guest, or false if the VM is
// unknown.
func (s Surface) Guest(t hypervisors.Target) (GuestState, bool) { return s.core.Guest(t) }

// GuestFile returns a file written into a VM's guest.
func (s Surface) GuestFile(t hypervisors.Target, path string) ([]byte, bool) {
	return s.core.GuestFile(t, path)
}

// Bootstraps returns the successful bootstrap runs of a VM, oldest first.
func (s Surface) Bootstraps(t hypervisors.Target) []Bootstrap { return s.core.Bootstraps(t) }

// SimGuest implements hypervisors.Simulator.
func (s Surface) SimGuest(t hypervisors.Target) (hypervisors.SimGuest, bool) {
	return s.core.SimGuest(t)
}
