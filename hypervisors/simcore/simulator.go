package simcore

import (
	"github.com/bigfleet-vm/provider/hypervisors"
)

// SimGuest is what the VM's simulated guest ran, as the admin endpoint
// shows it (never a file's content): the half of hypervisors.Simulator
// every simulator shares.
func (s *Core) SimGuest(t hypervisors.Target) (hypervisors.SimGuest, bool) {
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
