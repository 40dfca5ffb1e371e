package hypervisors

import (
	"cmp"
	"context"
	"time"

	"github.com/bigfleet-vm/provider/observed"
)

// The optional interfaces: what an adapter may offer beyond Hypervisor.
// A consumer holding a hypervisor that may be wrapped (instrumentation)
// reaches them with Find, or all at once with CapabilitiesOf. EventSource is with the events it delivers.

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

// RPCReporter is implemented by adapters that report the RPCs their
// operations make (libvirt): observe is called once per RPC.
type RPCReporter interface {
	ObserveRPCs(observe func(zone, procedure string, d time.Duration, err error))
}

// HostCapacity is what one zone's host offers: its memory and CPUs, and
// the size and free space of the storage VMs are built on. A zero field
// is unknown (not read), never "none".
type HostCapacity struct {
	MemoryBytes   uint64 `json:"memory_bytes"`
	CPUs          int    `json:"cpus"`
	DiskBytes     uint64 `json:"disk_bytes,omitempty"`
	DiskFreeBytes uint64 `json:"disk_free_bytes,omitempty"`
	StorageName   string `json:"storage,omitempty"` // the pool or storage read
}

// CapacityReader is implemented by adapters that can read a zone's host
// capacity (libvirt: node info and the zone's pool; Proxmox: the node's
// status and the target storage). An error means the answer is unknown.
type CapacityReader interface {
	ReadCapacity(ctx context.Context, zone string) (HostCapacity, error)
}

// Capabilities are a hypervisor's optional parts, one field each; nil
// means absent. A wrapper declares them (Capable) instead of being one
// type per combination of the parts it wraps: it passes a part through,
// or replaces it with its own.
type Capabilities struct {
	Health  HealthReporter // per-zone connection health
	Events  EventSource    // change events
	Volumes VolumeReader   // direct volume reads
	RPCs    RPCReporter    // per-RPC timings
	// Capacity reads a zone's host capacity.
	Capacity CapacityReader
	// Simulator changes a simulated world out of band (simulators only).
	Simulator Simulator
}

// Simulator is implemented by simulators: out-of-band changes to the
// simulated world, which the provider's /admin/ endpoints drive
// (--fake-admin). A VM is named by Target as the simulator names it
// (zone and name, or zone and VMID).
type Simulator interface {
	StopVM(Target) error
	PauseVM(Target) error
	ResizeVM(t Target, vcpu, memoryMiB int) error
	RemoveVM(Target) error
	SetUnreachable(zone string, on bool)
	SetFlaky(zone, op string, on bool) error
	// SimGuest is what the VM's simulated guest ran (false: no such VM).
	SimGuest(Target) (SimGuest, bool)
	// AddForeign places a VM this installation does not own, named
	// t.Name (t.VMID where the simulator numbers VMs; 0 allocates one).
	AddForeign(t Target) error
	// AddOwned places a running VM that carries m, named t.Name.
	AddOwned(t Target, m observed.Marker) error
}

// SimGuest is what a simulated guest ran: never a file's content.
type SimGuest struct {
	Bootstraps []SimBootstrap `json:"bootstraps"`
	Drains     int            `json:"drains"`
	DrainKeys  []string       `json:"drain_keys"`
	Cluster    string         `json:"cluster"`
}

// SimBootstrap is one bootstrap a simulated guest ran.
type SimBootstrap struct {
	Cluster string   `json:"cluster"`
	Argv    []string `json:"argv"`
	// Key is the guest-op key the hook ran under (its operation id).
	Key        string    `json:"key,omitempty"`
	BlobSHA256 string    `json:"blob_sha256"`
	BlobSize   int       `json:"blob_size"`
	At         time.Time `json:"at"`
}

// Capable is a hypervisor that declares its Capabilities (wrappers do).
type Capable interface {
	Capabilities() Capabilities
}

// CapabilitiesOf returns hv's optional parts: those it declares if it is
// Capable, else those it implements, completed (for a part still absent)
// by what an Unwrapper wraps.
func CapabilitiesOf(hv Hypervisor) Capabilities {
	var c Capabilities
	for hv != nil {
		var got Capabilities
		if cp, ok := hv.(Capable); ok {
			got = cp.Capabilities()
		} else {
			got.Health, _ = hv.(HealthReporter)
			got.Events, _ = hv.(EventSource)
			got.Volumes, _ = hv.(VolumeReader)
			got.RPCs, _ = hv.(RPCReporter)
			got.Capacity, _ = hv.(CapacityReader)
			got.Simulator, _ = hv.(Simulator)
		}
		c.Health = cmp.Or(c.Health, got.Health)
		c.Events = cmp.Or(c.Events, got.Events)
		c.Volumes = cmp.Or(c.Volumes, got.Volumes)
		c.RPCs = cmp.Or(c.RPCs, got.RPCs)
		c.Capacity = cmp.Or(c.Capacity, got.Capacity)
		c.Simulator = cmp.Or(c.Simulator, got.Simulator)
		if _, ok := hv.(Capable); ok {
			break
		}
		u, ok := hv.(Unwrapper)
		if !ok {
			break
		}
		hv = u.Unwrap()
	}
	return c
}

// Unwrapper is implemented by wrappers that pass every optional part of
// what they wrap through untouched (test doubles); a wrapper that
// changes a part is Capable instead.
type Unwrapper interface {
	Unwrap() Hypervisor
}

// Find returns hv's optional part T: one of the Capabilities' interfaces,
// through CapabilitiesOf (so a wrapper's own version of a part, e.g. the
// instrumented steps, is the one found); any other interface T is looked
// for along the Unwrapper chain.
func Find[T any](hv Hypervisor) (T, bool) {
	var zero T
	var part any
	switch any(&zero).(type) {
	case *HealthReporter:
		part = CapabilitiesOf(hv).Health
	case *EventSource:
		part = CapabilitiesOf(hv).Events
	case *VolumeReader:
		part = CapabilitiesOf(hv).Volumes
	case *RPCReporter:
		part = CapabilitiesOf(hv).RPCs
	case *CapacityReader:
		part = CapabilitiesOf(hv).Capacity
	case *Simulator:
		part = CapabilitiesOf(hv).Simulator
	default:
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
		return zero, false
	}
	if part == nil {
		return zero, false
	}
	t, ok := part.(T)
	return t, ok
}
