package capacity

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
)

// Reading is one zone's newest capacity read: the host's figures, or the
// error that read ended with (Host is then zero), and when it was made.
type Reading struct {
	Host hypervisors.HostCapacity
	Err  error
	At   time.Time
}

// Latest keeps the newest reading of each zone, so a Create can be held
// against its host without a hypervisor call of its own. It holds at
// most one reading per zone (the configured zones), and is safe for
// concurrent use; the zero value is empty and ready.
type Latest struct {
	mu sync.Mutex
	m  map[string]Reading
}

// Record stores the outcome of a read of every zone in zones (capacity.Read's
// answer): a zone in errs gets its error, a zone in hosts its figures, a
// zone in neither (the host reported nothing) a zero reading.
func (l *Latest) Record(zones []string, hosts map[string]hypervisors.HostCapacity, errs map[string]error, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = make(map[string]Reading, len(zones))
	}
	for _, z := range zones {
		l.m[z] = Reading{Host: hosts[z], Err: errs[z], At: at}
	}
}

// Get returns zone's newest reading; ok false before the first read.
func (l *Latest) Get(zone string) (r Reading, ok bool) {
	if l == nil {
		return Reading{}, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok = l.m[zone]
	return r, ok
}

// ErrShort is the class of every Short: errors.Is(err, ErrShort) holds
// for a Create the host cannot hold.
var ErrShort = errors.New("the host cannot hold the machine")

// Short says which resource of a zone's host cannot hold a machine, with
// the figures. Its message is what the machine's last_error carries.
type Short struct {
	Zone     string
	Resource string // CPU, Memory or Disk
	// Free is what is left of the resource (vCPUs, or bytes), Need what the
	// machine needs (vCPUs, or bytes; 0 for a disk: the catalog's types
	// carry no disk size).
	Free, Need uint64
	// CPUs and MaxRatio explain a vCPU figure: CPUs × MaxRatio vCPUs may
	// be placed on the host.
	CPUs     int
	MaxRatio float64
	// Storage names the pool or storage of a Disk shortage.
	Storage string
	// Unread: the zone has no capacity reading, so Free is not known.
	Unread bool
	// Cause is the hypervisor's refusal when the shortage was reported by
	// it rather than foreseen from the reading.
	Cause error
}

func (s *Short) Error() string {
	var msg string
	switch {
	case s.Resource == CPU:
		msg = fmt.Sprintf("host cpu: zone %s has %d vCPUs free (%d CPUs × overcommit %g), the machine needs %d vCPUs", s.Zone, s.Free, s.CPUs, s.MaxRatio, s.Need)
	case s.Resource == Memory && s.Unread:
		msg = fmt.Sprintf("host memory: zone %s cannot hold the machine's %d MiB (no capacity reading of the zone)", s.Zone, s.Need>>20)
	case s.Resource == Memory:
		msg = fmt.Sprintf("host memory: zone %s has %d MiB free, the machine needs %d MiB", s.Zone, s.Free>>20, s.Need>>20)
	case s.Resource == Disk && s.Unread:
		msg = fmt.Sprintf("storage pool space: zone %s has run out of storage space (no reading of its pool)", s.Zone)
	case s.Resource == Disk:
		msg = fmt.Sprintf("storage pool space: zone %s pool %s had %d MiB free at its newest reading", s.Zone, s.Storage, s.Free>>20)
	default:
		msg = fmt.Sprintf("host %s: zone %s cannot hold the machine", s.Resource, s.Zone)
	}
	if s.Cause != nil {
		msg += "; the hypervisor refused: " + s.Cause.Error()
	}
	return msg
}

// Unwrap makes errors.Is(err, ErrShort) hold, and the cause's classes.
func (s *Short) Unwrap() []error { return []error{ErrShort, s.Cause} }

// Fit says whether one more machine needing need fits zone's host next to
// used (what the zone's other machines hold): its memory must fit the
// host's physically, its vCPUs within the host's CPUs times maxRatio
// (<= 0 means 1). It returns the first resource short (memory before
// cpu), or nil. A figure the host did not report is not checked.
func Fit(zone string, host hypervisors.HostCapacity, used, need Usage, maxRatio float64) *Short {
	if maxRatio <= 0 {
		maxRatio = 1
	}
	if host.MemoryBytes > 0 && used.MemoryBytes+need.MemoryBytes > host.MemoryBytes {
		return &Short{Zone: zone, Resource: Memory, Free: sub(host.MemoryBytes, used.MemoryBytes), Need: need.MemoryBytes}
	}
	if host.CPUs > 0 {
		limit := uint64(float64(host.CPUs) * maxRatio)
		if uint64(used.VCPU+need.VCPU) > limit {
			return &Short{Zone: zone, Resource: CPU, Free: sub(limit, uint64(used.VCPU)), Need: uint64(need.VCPU), CPUs: host.CPUs, MaxRatio: maxRatio}
		}
	}
	return nil
}

func sub(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}
