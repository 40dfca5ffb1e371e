package simcore

import (
	"context"
	"fmt"
	"slices"

	"github.com/bigfleet-vm/provider/hypervisors"
)

// ReadCapacity is hypervisors.CapacityReader for a simulator with zones:
// the configured host (Options.Host, Options.Hosts).
func (s *Core) ReadCapacity(ctx context.Context, zones []string, zone string) (hypervisors.HostCapacity, error) {
	if !slices.Contains(zones, zone) {
		return hypervisors.HostCapacity{}, fmt.Errorf("zone %q is not configured: %w", zone, hypervisors.ErrInvalid)
	}
	if err := s.Enter(ctx, "read-capacity", zone, hypervisors.Target{Zone: zone}); err != nil {
		return hypervisors.HostCapacity{}, fmt.Errorf("read capacity of %s: %w", zone, err)
	}
	if h, ok := s.opts.Hosts[zone]; ok {
		return h, nil
	}
	return s.opts.Host, nil
}
