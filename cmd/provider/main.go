package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/server"
	"github.com/bigfleet-vm/provider/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// subcommands are listed by help and by the unknown-subcommand error.
var subcommands = []struct{ name, what string }{
	{"serve", "serve the CapacityProvider (the default when no subcommand is given)"},
	{"plan", "print what the next reconcile would do (offline, or --server of a running provider)"},
	{"pve-sim", "serve the in-project Proxmox VE API simulator for demos"},
	{"version", "print the version"},
	{"help", "print this list, or a subcommand's flags: provider help SUBCOMMAND"},
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
		fmt.Fprintln(stdout, "provider", version.String(), version.Go())
		return 0
	case "help":
		if len(args) > 0 && args[0] != "help" && known(args[0]) && args[0] != "version" {
			// The subcommand's own -h writes its flags to stderr; help
			// output belongs on stdout.
			return run(ctx, []string{args[0], "-h"}, stdout, stdout)
		}
		usage(stdout)
		return 0
	}
	fmt.Fprintf(stderr, "provider: unknown subcommand %q\n", bounded(sub, 64))
	usage(stderr)
	return 2
}

func known(sub string) bool {
	for _, s := range subcommands {
		if s.name == sub {
			return true
		}
	}
	return false
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: provider [SUBCOMMAND] [flags]")
	fmt.Fprintln(w, "subcommands:")
	for _, s := range subcommands {
		fmt.Fprintf(w, "  %-8s %s\n", s.name, s.what)
	}
	fmt.Fprintln(w, "`provider SUBCOMMAND -h` lists a subcommand's flags.")
}

// bounded cuts s to n bytes for a message.
func bounded(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

func serve(ctx context.Context, args []string, stderr io.Writer) int {
	cfg, err := config.Parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0 // the flag package has printed the usage
	}
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
