package cli

import (
	"github.com/bigfleet-vm/provider/hypervisors/libvirt"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox"
	"github.com/bigfleet-vm/provider/plugin"
)

// registry is the shipped build's (cmd/provider's): the tests pin what
// its binary prints.
func registry() *plugin.Registry {
	return plugin.MustRegistry(libvirt.Plugin(), proxmox.Plugin())
}
