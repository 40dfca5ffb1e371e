package fake

import (
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/observed"
)

// Both simulators have the Simulator capability: the provider's /admin/
// endpoints drive them without knowing which one they serve.
var (
	_ hypervisors.Simulator = (*Libvirt)(nil)
	_ hypervisors.Simulator = (*Proxmox)(nil)
)

// SimGuest is what the VM's simulated guest ran, as the admin endpoint
// shows it (never a file's content).
func (s *sim) SimGuest(t hypervisors.Target) (hypervisors.SimGuest, bool) {
	g, ok := s.Guest(t)
	if !ok {
		return hypervisors.SimGuest{}, false
	}
	out := hypervisors.SimGuest{Drains: g.Drains, DrainKeys: g.DrainKeys, Cluster: g.Cluster}
	if g.Bootstraps != nil {
		out.Bootstraps = make([]hypervisors.SimBootstrap, len(g.Bootstraps))
	}
	for i, b := range g.Bootstraps {
		out.Bootstraps[i] = hypervisors.SimBootstrap{Cluster: b.Cluster, Argv: b.Argv, Key: b.Key,
			BlobSHA256: b.BlobSHA256, BlobSize: b.BlobSize, At: b.At}
	}
	return out, true
}

// AddForeign defines a domain named t.Name that this installation does
// not own.
func (f *Libvirt) AddForeign(t hypervisors.Target) error { return f.AddForeignVM(t.Zone, t.Name, nil) }

// AddOwned defines a running domain named t.Name that carries m.
func (f *Libvirt) AddOwned(t hypervisors.Target, m observed.Marker) error {
	return f.AddOwnedVM(t.Zone, t.Name, m, observed.PowerRunning)
}

// AddForeign places a VM this installation does not own, with VMID
// t.VMID (0 allocates one).
func (f *Proxmox) AddForeign(t hypervisors.Target) error {
	_, err := f.AddForeignVM(t.Zone, t.VMID, t.Name, nil)
	return err
}

// AddOwned places a running VM named t.Name that carries m.
func (f *Proxmox) AddOwned(t hypervisors.Target, m observed.Marker) error {
	_, err := f.AddOwnedVM(t.Zone, t.Name, m, observed.PowerRunning)
	return err
}
