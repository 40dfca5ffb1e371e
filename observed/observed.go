package observed

import (
	"sort"
	"strconv"
	"time"
)

// Power is the power state of a VM as the hypervisor reports it.
type Power string

const (
	PowerRunning Power = "running"
	PowerPaused  Power = "paused"
	PowerStopped Power = "stopped"
	PowerCrashed Power = "crashed"
	PowerUnknown Power = "unknown"
)

// Marker is the ownership and binding record a VM carries (libvirt: a
// metadata element in the project's XML namespace; Proxmox: tags plus lines
// in the description). Only a VM whose marker names this installation is
// ever adopted, stopped or destroyed.
type Marker struct {
	Installation string `json:"installation" yaml:"installation"`
	MachineID    string `json:"machine_id" yaml:"machine_id"`
	OpID         string `json:"op_id,omitempty" yaml:"op_id,omitempty"`
	InstanceType string `json:"instance_type,omitempty" yaml:"instance_type,omitempty"`
	// Cluster is the binding recorded after a successful Configure; empty
	// when unbound.
	Cluster string `json:"cluster,omitempty" yaml:"cluster,omitempty"`
}

// VM is one virtual machine on a host or node.
type VM struct {
	Zone string `json:"zone" yaml:"zone"`
	// Name is the VM's name on its hypervisor (a libvirt domain's, a
	// Proxmox VM's).
	Name string `json:"name" yaml:"name"`
	// VMID is the numeric id a hypervisor that finds VMs by id allocated
	// (planner.ByID, such as a Proxmox VMID); 0 on one that finds them by
	// name.
	VMID int `json:"vmid,omitempty" yaml:"vmid,omitempty"`
	// Marker is nil for a VM that does not carry this installation's marker.
	Marker    *Marker `json:"marker,omitempty" yaml:"marker,omitempty"`
	Power     Power   `json:"power" yaml:"power"`
	VCPU      int     `json:"vcpu,omitempty" yaml:"vcpu,omitempty"`
	MemoryMiB int     `json:"memory_mib,omitempty" yaml:"memory_mib,omitempty"`
	// Template marks a VM that is a clone source (a Proxmox template):
	// never a candidate for anything.
	Template bool `json:"template,omitempty" yaml:"template,omitempty"`
	// Autostart is libvirt autostart / Proxmox onboot.
	Autostart bool `json:"autostart,omitempty" yaml:"autostart,omitempty"`
	// Volumes lists the names of the volumes the domain's disks point at
	// (libvirt only), so a half-built domain can be told from a complete one.
	Volumes []string `json:"volumes,omitempty" yaml:"volumes,omitempty"`
}

// Ref is the stable host reference reported to BigFleet: "<zone>/<vmid>"
// for a VM with a numeric id (Proxmox), else "<zone>/<name>" (libvirt).
func (v *VM) Ref() string {
	if v.VMID != 0 {
		return v.Zone + "/" + strconv.Itoa(v.VMID)
	}
	return v.Zone + "/" + v.Name
}

// Owned reports whether the VM carries a marker of the given installation.
func (v *VM) Owned(installation string) bool {
	return v != nil && v.Marker != nil && v.Marker.Installation == installation
}

// Volume is a storage volume in the configured pool (libvirt only).
type Volume struct {
	Zone string `json:"zone" yaml:"zone"`
	Pool string `json:"pool" yaml:"pool"`
	Name string `json:"name" yaml:"name"`
	// Format is "qcow2", "raw" or "iso".
	Format string `json:"format,omitempty" yaml:"format,omitempty"`
	// BackingFormat is the declared format of the backing store, if any.
	BackingFormat string `json:"backing_format,omitempty" yaml:"backing_format,omitempty"`
	// Identity is the content identity a seed volume carries
	// (lvspec.SeedIdentity of what it was built from), read from the
	// volume itself; empty when it carries none, e.g. a volume created
	// but never (or only partly) uploaded. Empty for other volumes.
	Identity string `json:"identity,omitempty" yaml:"identity,omitempty"`
}

// Status says whether a zone could be read.
type Status string

const (
	StatusOK      Status = "ok"
	StatusUnknown Status = "unknown"
)

// Zone is the result of observing one libvirt host or Proxmox node.
type Zone struct {
	Name   string `json:"name" yaml:"name"`
	Status Status `json:"status" yaml:"status"`
	// Err says why the zone is unknown.
	Err     string    `json:"error,omitempty" yaml:"error,omitempty"`
	VMs     []*VM     `json:"vms,omitempty" yaml:"vms,omitempty"`
	Volumes []*Volume `json:"volumes,omitempty" yaml:"volumes,omitempty"`
	At      time.Time `json:"at" yaml:"at"`
	// VolumesAt is when Volumes was listed; zero when the observation did
	// not list volumes (then an absent volume proves nothing).
	VolumesAt time.Time `json:"volumes_at,omitempty" yaml:"volumes_at,omitempty"`
}

// Unknown returns the observation of a zone that could not be read.
func Unknown(zone string, err error, at time.Time) *Zone {
	msg := "unreachable"
	if err != nil {
		msg = err.Error()
	}
	return &Zone{Name: zone, Status: StatusUnknown, Err: msg, At: at}
}

// Snapshot is one observation of every configured zone.
type Snapshot struct {
	Zones map[string]*Zone `json:"zones" yaml:"zones"`
	At    time.Time        `json:"at" yaml:"at"`
}

// ZoneNames returns the zone names in sorted order.
func (s *Snapshot) ZoneNames() []string {
	names := make([]string, 0, len(s.Zones))
	for n := range s.Zones {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Index is a read-only lookup structure over a snapshot, built once per
// plan so that planning one machine costs O(1) map lookups. Building it is
// the planner's hot path at fleet scale: the common case (one VM per
// machine id and per name) costs one map assignment per key, and the rare
// duplicates are collected by a second pass only when there are any.
type Index struct {
	snap *Snapshot
	// owned maps a machine id to a VM carrying it in our marker; further
	// ones (a leak) are in ownedMore.
	owned     map[string]*VM
	ownedMore map[string][]*VM
	// byName maps a VM name to one VM with it; names repeated within or
	// across zones are in nameMore.
	byName   map[string]*VM
	nameMore map[string][]*VM
	volumes  map[volKey]*Volume
}

type volKey struct{ zone, name string }

// NewIndex indexes a snapshot for the given installation.
func NewIndex(s *Snapshot, installation string) *Index {
	ix := &Index{snap: s}
	if s == nil {
		return ix
	}
	nVM, nVol, nOwned := 0, 0, 0
	for _, z := range s.Zones {
		nVM += len(z.VMs)
		nVol += len(z.Volumes)
	}
	ix.owned = make(map[string]*VM, nVM)
	ix.byName = make(map[string]*VM, nVM)
	ix.volumes = make(map[volKey]*Volume, nVol)
	for _, z := range s.Zones {
		for _, vm := range z.VMs {
			if vm.Owned(installation) {
				ix.owned[vm.Marker.MachineID] = vm
				nOwned++
			}
			ix.byName[vm.Name] = vm
		}
		for _, vol := range z.Volumes {
			ix.volumes[volKey{z.Name, vol.Name}] = vol
		}
	}
	if len(ix.owned) != nOwned || len(ix.byName) != nVM {
		ix.collectDuplicates(installation)
	}
	return ix
}

// collectDuplicates moves every VM but the indexed one of a repeated
// machine id or name into the side maps.
func (ix *Index) collectDuplicates(installation string) {
	ix.ownedMore, ix.nameMore = map[string][]*VM{}, map[string][]*VM{}
	for _, zn := range ix.snap.ZoneNames() {
		for _, vm := range ix.snap.Zones[zn].VMs {
			if vm.Owned(installation) && ix.owned[vm.Marker.MachineID] != vm {
				ix.ownedMore[vm.Marker.MachineID] = append(ix.ownedMore[vm.Marker.MachineID], vm)
			}
			if ix.byName[vm.Name] != vm {
				ix.nameMore[vm.Name] = append(ix.nameMore[vm.Name], vm)
			}
		}
	}
}

// Zone returns the observation of a zone, or nil if the zone was not
// observed at all (which the planner treats like Unknown).
func (ix *Index) Zone(name string) *Zone {
	if ix.snap == nil {
		return nil
	}
	return ix.snap.Zones[name]
}

// Owned returns the VMs that carry our marker for a machine id: first is
// nil when there is none; more is non-empty only for a leak.
func (ix *Index) Owned(machineID string) (first *VM, more []*VM) {
	return ix.owned[machineID], ix.ownedMore[machineID]
}

// OwnedIDs returns, sorted, every machine id found in a marker for which
// keep returns true.
func (ix *Index) OwnedIDs(keep func(id string) bool) []string {
	var ids []string
	for id := range ix.owned {
		if keep(id) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// ByName returns the VMs with a name in a zone.
func (ix *Index) ByName(zone, name string) []*VM {
	var out []*VM
	if vm := ix.byName[name]; vm != nil && vm.Zone == zone {
		out = append(out, vm)
	}
	for _, vm := range ix.nameMore[name] {
		if vm.Zone == zone {
			out = append(out, vm)
		}
	}
	return out
}

// Volume returns a volume by zone and name, or nil.
func (ix *Index) Volume(zone, name string) *Volume { return ix.volumes[volKey{zone, name}] }
