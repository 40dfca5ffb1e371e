package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/jsonplan"
	"github.com/bigfleet-vm/provider/plugin"
	"github.com/bigfleet-vm/provider/server"
	"github.com/bigfleet-vm/provider/statefile"
)

// plan prints what the next reconcile would do. Offline (the default) it
// takes serve's flags and reads the state and the hypervisors read-only;
// with --server it asks a running provider. Exit codes: 1 on error; else
// 0, or with --detailed-exitcode 0 for no changes and 2 for changes
// pending.
func plan(ctx context.Context, reg *plugin.Registry, args []string, stdout, stderr io.Writer) int {
	set := flag.NewFlagSet("provider plan", flag.ContinueOnError)
	set.SetOutput(stderr)
	flags := config.RegisterFlags(set, reg)
	srv := set.String("server", "", "Ask a running provider instead of planning offline: its metrics listener, e.g. http://127.0.0.1:9090 (GET /debug/plan), or https:// with --metrics-tls.")
	serverCA := set.String("server-ca", "", "PEM bundle that verifies the --server listener's certificate (https://), instead of the system roots.")
	asJSON := set.Bool("json", false, "Print the versioned JSON plan instead of text.")
	detailed := set.Bool("detailed-exitcode", false, "Exit 0 when there are no changes, 2 when changes are pending, 1 on error.")
	noColor := set.Bool("no-color", false, "Never colour the text plan (it is coloured only on a terminal anyway).")
	set.Usage = func() {
		fmt.Fprintf(stderr, "Usage: provider plan [--server URL [--server-ca FILE]] [--json] [--detailed-exitcode] [--no-color] [serve flags]\n")
		flags.Usage(stderr, set)
	}
	if err := set.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 1
	}
	if set.NArg() > 0 {
		fmt.Fprintf(stderr, "provider plan: unexpected argument %q\n", bounded(set.Arg(0), 64))
		return 1
	}

	var (
		p    *jsonplan.Plan
		body []byte // the JSON plan as its producer encoded it
	)
	if *srv != "" {
		var err error
		if p, body, err = server.FetchPlan(ctx, *srv, server.FetchOptions{CAFile: *serverCA}); err != nil {
			fmt.Fprintf(stderr, "provider plan: %v\n", err)
			return 1
		}
	} else {
		cfg, err := flags.Resolve(set)
		if err != nil {
			fmt.Fprintf(stderr, "provider plan: invalid configuration:\n%v\n", err)
			return 1
		}
		if err := stateExists(cfg); err != nil {
			fmt.Fprintf(stderr, "provider plan: %v\n", err)
			return 1
		}
		offline, err := server.OfflinePlanJSON(ctx, cfg)
		if err != nil {
			fmt.Fprintf(stderr, "provider plan: %v\n", err)
			return 1
		}
		if body, err = jsonplan.Marshal(offline); err == nil {
			p, err = jsonplan.Decode(body)
		}
		if err != nil {
			fmt.Fprintf(stderr, "provider plan: %v\n", err)
			return 1
		}
	}

	var err error
	if *asJSON {
		_, err = stdout.Write(body)
	} else {
		err = jsonplan.Write(stdout, p, jsonplan.TextOptions{Color: !*noColor && terminal(stdout)})
	}
	if err != nil {
		fmt.Fprintf(stderr, "provider plan: %v\n", err)
		return 1
	}
	if *detailed && p.HasChanges() {
		return 2
	}
	return 0
}

// stateExists refuses a --state that names no state: planning it would
// print the plan of a fresh installation and exit 0, so a typo in the
// path would look like a clean plan.
func stateExists(cfg *config.Config) error {
	path := cfg.StatePath
	if cfg.Etcd != nil {
		return nil // an empty prefix is a fresh installation; OfflinePlan reads it
	}
	if path == "" {
		return nil
	}
	_, err := statefile.ReadOnly(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("--state %s: no state file there (a provider creates it at its first start); check the path, or omit --state to plan a fresh installation", path)
	}
	return err
}

// terminal reports whether w is a character device (a terminal).
func terminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
