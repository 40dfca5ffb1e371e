package server

import (
	"github.com/bigfleet-vm/provider/hypervisors/libvirt"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox"
	"github.com/bigfleet-vm/provider/plugin"
)

// testReg is the shipped build's registry.
var testReg = plugin.MustRegistry(libvirt.Plugin(), proxmox.Plugin())
