package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

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
	{"history", "print what happened to a machine, or a fleet timeline (offline from --state, or --server)"},
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
	case "history":
		return history(ctx, args, stdout, stderr)
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

// startupStopGrace bounds how long a start-up interrupted by SIGTERM or
// SIGINT may take to return on its own (start-up honours the signal where
// it waits on the network); after it the process exits anyway, so a
// start-up stuck in a read that cannot be interrupted (a hung file
// system) still obeys the signal.
var startupStopGrace = 5 * time.Second

// parseConfig is config.Parse; tests replace it with one that blocks.
var parseConfig = config.Parse

// started is what start-up made: a provider to serve, or the exit code.
type started struct {
	p    *server.Provider
	log  *slog.Logger
	code int
}

func serve(ctx context.Context, args []string, stderr io.Writer) int {
	done := make(chan started, 1)
	go func() { done <- startUp(ctx, args, stderr) }()
	var s started
	select {
	case s = <-done:
	case <-ctx.Done():
		select {
		case s = <-done:
		case <-time.After(startupStopGrace):
			fmt.Fprintf(stderr, "provider: stopped during start-up: it did not return within %s of the signal (stuck reading a file or dialling?)\n", startupStopGrace)
			return 1
		}
	}
	if s.p == nil {
		return s.code
	}
	defer s.p.Close()
	if err := s.p.Serve(ctx); err != nil {
		s.log.Error("serve failed", "err", err)
		return 1
	}
	return 0
}

// startUp parses the flags and assembles the provider.
func startUp(ctx context.Context, args []string, stderr io.Writer) started {
	cfg, err := parseConfig(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return started{code: 0} // the flag package has printed the usage
	}
	if err != nil {
		fmt.Fprintf(stderr, "provider: invalid configuration:\n%v\n", err)
		return started{code: 2}
	}
	log := server.Logger(cfg, stderr)
	p, err := server.Build(ctx, cfg, log)
	if err != nil {
		log.Error("startup failed", "err", err)
		return started{code: 1}
	}
	return started{p: p, log: log}
}
