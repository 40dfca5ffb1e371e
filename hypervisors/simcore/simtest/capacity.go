package simtest

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
)

// testReadCapacity: the simulator reports the configured host, a zone's
// own host first, zero where none is configured, and fail like any call
// on an unreachable zone.
func testReadCapacity(t *testing.T, s Shape) {
	all := hypervisors.HostCapacity{MemoryBytes: 64 << 30, CPUs: 16, DiskBytes: 1 << 40, DiskFreeBytes: 1 << 39, StorageName: "default"}
	small := hypervisors.HostCapacity{MemoryBytes: 8 << 30, CPUs: 4}
	ctx := context.Background()
	hv := s.open(t, simcore.Options{Host: all, Hosts: map[string]hypervisors.HostCapacity{"fake-b": small}})
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
	none := s.open(t, simcore.Options{})
	if got, err := none.(hypervisors.CapacityReader).ReadCapacity(ctx, "fake-a"); err != nil || got != (hypervisors.HostCapacity{}) {
		t.Errorf("no host configured: %+v, %v; want no reading", got, err)
	}
}
