package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/bigfleet-vm/provider/cli"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox"
	"github.com/bigfleet-vm/provider/plugin"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, registry(), os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// registry is the hypervisors this build serves, the default first: the
// one place that imports their packages.
func registry() *plugin.Registry {
	return plugin.MustRegistry(libvirt.Plugin(), proxmox.Plugin())
}
