package fake

import (
	"context"
	"fmt"
	"slices"

	"github.com/bigfleet-vm/provider/hypervisors"
)

var (
	_ hypervisors.CapacityReader = (*Libvirt)(nil)
	_ hypervisors.CapacityReader = (*Proxmox)(nil)
)

// ReadCapacity implements hypervisors.CapacityReader with the configured
// host (Options.Host, Options.Hosts).
func (l *Libvirt) ReadCapacity(ctx context.Context, zone string) (hypervisors.HostCapacity, error) {
	return l.readCapacity(ctx, l.zones, zone)
}

// ReadCapacity implements hypervisors.CapacityReader with the configured
// host (Options.Host, Options.Hosts).
func (p *Proxmox) ReadCapacity(ctx context.Context, zone string) (hypervisors.HostCapacity, error) {
	return p.readCapacity(ctx, p.zones, zone)
}

func (s *sim) readCapacity(ctx context.Context, zones []string, zone string) (hypervisors.HostCapacity, error) {
	if !slices.Contains(zones, zone) {
		return hypervisors.HostCapacity{}, fmt.Errorf("zone %q is not configured: %w", zone, hypervisors.ErrInvalid)
	}
	if err := s.enter(ctx, "read-capacity", zone, hypervisors.Target{Zone: zone}); err != nil {
		return hypervisors.HostCapacity{}, fmt.Errorf("read capacity of %s: %w", zone, err)
	}
	if h, ok := s.opts.Hosts[zone]; ok {
		return h, nil
	}
	return s.opts.Host, nil
}
