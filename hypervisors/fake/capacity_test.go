package fake

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/hypervisors"
)

// TestReadCapacity: both simulators report the configured host, a zone's
// own host first, zero where none is configured, and fail like any call
// on an unreachable zone.
func TestReadCapacity(t *testing.T) {
	all := hypervisors.HostCapacity{MemoryBytes: 64 << 30, CPUs: 16, DiskBytes: 1 << 40, DiskFreeBytes: 1 << 39, StorageName: "default"}
	small := hypervisors.HostCapacity{MemoryBytes: 8 << 30, CPUs: 4}
	for _, tc := range []struct {
		name string
		hv   func(Options) hypervisors.Hypervisor
	}{
		{"libvirt", func(o Options) hypervisors.Hypervisor { return NewLibvirt(o) }},
		{"proxmox", func(o Options) hypervisors.Hypervisor { return NewProxmox(o) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			hv := tc.hv(Options{Host: all, Hosts: map[string]hypervisors.HostCapacity{"fake-b": small}})
			defer hv.Close()
			cr, ok := hypervisors.Find[hypervisors.CapacityReader](hv)
			if !ok {
				t.Fatal("no CapacityReader")
			}
			for zone, want := range map[string]hypervisors.HostCapacity{"fake-a": all, "fake-b": small} {
				got, err := cr.ReadCapacity(ctx, zone)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("%s (-want +got):\n%s", zone, diff)
				}
			}
			if _, err := cr.ReadCapacity(ctx, "nope"); !errors.Is(err, hypervisors.ErrInvalid) {
				t.Errorf("unknown zone: %v, want ErrInvalid", err)
			}
			none := tc.hv(Options{})
			defer none.Close()
			if got, err := none.(hypervisors.CapacityReader).ReadCapacity(ctx, "fake-a"); err != nil || got != (hypervisors.HostCapacity{}) {
				t.Errorf("no host configured: %+v, %v; want no reading", got, err)
			}
		})
	}
}
