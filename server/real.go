package server

import (
	"context"
	"errors"
	"log/slog"

	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/hypervisors"
)

func openLibvirt(context.Context, *config.Config, string, *slog.Logger) (hypervisors.Hypervisor, error) {
	return nil, errors.New("the real libvirt backend is not wired into this build yet; run with --use-fake-backend for the simulator")
}

func openProxmox(context.Context, *config.Config, string, *slog.Logger) (hypervisors.Hypervisor, error) {
	return nil, errors.New("the real Proxmox backend is not wired into this build yet; run with --use-fake-backend for the simulator")
}
