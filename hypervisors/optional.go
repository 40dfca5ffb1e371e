package hypervisors

import (
	"context"

	"github.com/bigfleet-vm/provider/observed"
)

// The optional interfaces: what an adapter may offer beyond Hypervisor.
// A consumer holding a hypervisor that may be wrapped (instrumentation)
// reaches them with Find. EventSource is with the events it delivers.

// HealthReporter is implemented by adapters that track per-zone
// connection health; it feeds /readyz detail and metrics.
type HealthReporter interface {
	// ZoneHealth maps each zone to nil (healthy) or why it is not.
	ZoneHealth() map[string]error
}

// VolumeReader is implemented by adapters that can read named volumes
// directly (libvirt), so per-machine work need not wait for a full
// listing. Missing volumes are simply absent from the result; an error
// means the answer is unknown.
type VolumeReader interface {
	ReadVolumes(ctx context.Context, zone, pool string, names []string) ([]*observed.Volume, error)
}

// Unwrapper is implemented by wrappers (instrumentation) around an adapter.
type Unwrapper interface {
	Unwrap() Hypervisor
}

// Find returns the first hypervisor in hv's wrapper chain that implements
// T: how consumers reach a shape's steps or an optional interface through
// instrumentation. A wrapper that implements T itself (to instrument it)
// is found before what it wraps.
func Find[T any](hv Hypervisor) (T, bool) {
	for hv != nil {
		if t, ok := hv.(T); ok {
			return t, true
		}
		u, ok := hv.(Unwrapper)
		if !ok {
			break
		}
		hv = u.Unwrap()
	}
	var zero T
	return zero, false
}
