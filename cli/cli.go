package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/plugin"
	"github.com/bigfleet-vm/provider/server"
	"github.com/bigfleet-vm/provider/version"
)

// Run runs the provider binary's command line args (after the program
// name) with the hypervisors of reg, and returns the exit code. The
// composition root (cmd/provider) builds reg; a plug-in's tests build
// their own and run the provider on it.
func Run(ctx context.Context, reg *plugin.Registry, args []string, stdout, stderr io.Writer) int {
	return run(ctx, reg, args, stdout, stderr)
}

// subcommand is one entry of help and of the unknown-subcommand error.
type subcommand struct{ name, what string }

// subcommands are the core's subcommands around those the hypervisors
// add (after history).
func subcommands(reg *plugin.Registry) []subcommand {
	subs := []subcommand{
		{"serve", "serve the CapacityProvider (the default when no subcommand is given)"},
		{"plan", "print what the next reconcile would do (offline, or --server of a running provider)"},
		{"history", "print what happened to a machine, or a fleet timeline (offline from --state, or --server)"},
	}
	for _, c := range reg.Commands() {
		subs = append(subs, subcommand{c.Name, c.What})
	}
	return append(subs,
		subcommand{"version", "print the version"},
		subcommand{"help", "print this list, or a subcommand's flags: provider help SUBCOMMAND"})
}

func run(ctx context.Context, reg *plugin.Registry, args []string, stdout, stderr io.Writer) int {
	sub := "serve"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		sub, args = args[0], args[1:]
	}
	switch sub {
	case "serve":
		return serve(ctx, reg, args, stderr)
	case "plan":
		return plan(ctx, reg, args, stdout, stderr)
	case "history":
		return history(ctx, reg, args, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "provider", version.String(), version.Go())
		return 0
	case "help":
		if len(args) > 0 && args[0] != "help" && known(reg, args[0]) && args[0] != "version" {
			// The subcommand's own -h writes its flags to stderr; help
			// output belongs on stdout.
			return run(ctx, reg, []string{args[0], "-h"}, stdout, stdout)
		}
		usage(reg, stdout)
		return 0
	}
	for _, c := range reg.Commands() {
		if c.Name == sub {
			return c.Run(ctx, args, stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "provider: unknown subcommand %q\n", bounded(sub, 64))
	usage(reg, stderr)
	return 2
}

func known(reg *plugin.Registry, sub string) bool {
	for _, s := range subcommands(reg) {
		if s.name == sub {
			return true
		}
	}
	return false
}

func usage(reg *plugin.Registry, w io.Writer) {
	fmt.Fprintln(w, "usage: provider [SUBCOMMAND] [flags]")
	fmt.Fprintln(w, "subcommands:")
	for _, s := range subcommands(reg) {
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

func serve(ctx context.Context, reg *plugin.Registry, args []string, stderr io.Writer) int {
	done := make(chan started, 1)
	go func() { done <- startUp(ctx, reg, args, stderr) }()
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
func startUp(ctx context.Context, reg *plugin.Registry, args []string, stderr io.Writer) started {
	cfg, err := parseConfig(reg, args, stderr)
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
	if n := syncProcs(p.SyncingGoroutines(), os.Getenv); n > 0 {
		log.Info("GOMAXPROCS raised for the journal's syncing goroutines", "gomaxprocs", n, "default", defaultProcs)
	}
	return started{p: p, log: log}
}
