// Command provider is the BigFleet CapacityProvider for libvirt hosts and
// Proxmox clusters. It only wires: flags and subcommands here, logic in
// the packages.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/server"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	sub := "serve"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		sub, args = args[0], args[1:]
	}
	switch sub {
	case "serve":
		return serve(ctx, args, stderr)
	case "plan":
		return plan(ctx, args, stdout, stderr)
	case "pve-sim":
		return pveSim(ctx, args, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "provider", version)
		return 0
	case "help":
		fmt.Fprintln(stdout, "usage: provider [serve|plan|pve-sim|version] [flags]; provider serve -h lists the flags")
		return 0
	}
	fmt.Fprintf(stderr, "provider: unknown subcommand %q (want serve, plan or version)\n", sub)
	return 2
}

func serve(ctx context.Context, args []string, stderr io.Writer) int {
	cfg, err := config.Parse(args, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "provider: invalid configuration:\n%v\n", err)
		return 2
	}
	log := server.Logger(cfg, stderr)
	p, err := server.Build(ctx, cfg, log)
	if err != nil {
		log.Error("startup failed", "err", err)
		return 1
	}
	defer p.Close()
	if err := p.Serve(ctx); err != nil {
		log.Error("serve failed", "err", err)
		return 1
	}
	return 0
}
