package deploy_test

import (
	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox"
	"github.com/bigfleet-vm/provider/plugin"
)

// registry is the shipped build's (cmd/provider's): the chart deploys it.
var registry = plugin.MustRegistry(libvirt.Plugin(), proxmox.Plugin())

// The bounded flags' tables, the core's merged with the hypervisors'.
var durationBounds, intBounds, floatBounds = config.Bounds(registry)
