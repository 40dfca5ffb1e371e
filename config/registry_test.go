package config

import (
	"io"

	"github.com/bigfleet-vm/provider/hypervisors/libvirt"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox"
	"github.com/bigfleet-vm/provider/plugin"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// testReg is the shipped build's registry: config's tests check the
// messages and settings of the two hypervisors through their plug-ins.
var testReg = plugin.MustRegistry(libvirt.Plugin(), proxmox.Plugin())

// parse is Parse with testReg.
func parse(args []string, stderr io.Writer) (*Config, error) { return Parse(testReg, args, stderr) }

// ignoreResolved leaves the plug-ins' derived, unexported state out of a
// comparison.
var ignoreResolved = cmpopts.IgnoreUnexported(libvirt.Settings{}, proxmox.Settings{})
