package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/jsonhistory"
	"github.com/bigfleet-vm/provider/plugin"
	"github.com/bigfleet-vm/provider/server"
)

// history prints what happened to a machine (provider history MACHINE_ID)
// or, with --since/--zone/--state, a fleet timeline. Offline (the default)
// it takes serve's flags and reads --state read-only; with --server it
// asks a running provider's metrics listener. Exit 1 on error.
func history(ctx context.Context, reg *plugin.Registry, args []string, stdout, stderr io.Writer) int {
	set := flag.NewFlagSet("provider history", flag.ContinueOnError)
	set.SetOutput(stderr)
	flags := config.RegisterFlags(set, reg)
	srv := set.String("server", "", "Ask a running provider instead of reading --state: its metrics listener, e.g. http://127.0.0.1:9090 (GET /debug/history), or https:// with --metrics-tls.")
	serverCA := set.String("server-ca", "", "PEM bundle that verifies the --server listener's certificate (https://), instead of the system roots.")
	asJSON := set.Bool("json", false, "Print the versioned JSON history (docs/history-format.md) instead of text.")
	since := set.Duration("since", 0, "Fleet timeline: events of the last DURATION (e.g. 10m; at most 720h) of every machine.")
	zone := set.String("zone", "", "Fleet timeline: only machines of this zone.")
	// Not --state: that is serve's flag naming the state to read.
	state := set.String("machine-state", "", "Fleet timeline: only machines now in this state (e.g. FAILED; DELETED for machines that left the document).")
	set.Usage = func() {
		fmt.Fprintf(stderr, "Usage: provider history [MACHINE_ID | --since DURATION [--zone Z] [--machine-state S]] [--server URL [--server-ca FILE]] [--json] [serve flags]\n")
		flags.Usage(stderr, set)
	}
	// The machine id may come first: provider history ID --state FILE.
	var id string
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		id, args = args[0], args[1:]
	}
	if err := set.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 1
	}
	if set.NArg() > 0 {
		if id != "" || set.NArg() > 1 {
			fmt.Fprintf(stderr, "provider history: unexpected argument %q\n", bounded(set.Arg(set.NArg()-1), 64))
			return 1
		}
		id = set.Arg(0)
	}
	q := server.HistoryQuery{Machine: id, Since: *since, Zone: *zone, State: *state}
	if id == "" && *since == 0 && *zone == "" && *state == "" {
		fmt.Fprintln(stderr, "provider history: name a machine (provider history MACHINE_ID) or ask for a fleet timeline (--since 10m [--zone Z] [--machine-state S])")
		return 1
	}
	var (
		h    *jsonhistory.History
		body []byte
		err  error
	)
	if *srv != "" {
		h, body, err = server.FetchHistory(ctx, *srv, q, server.FetchOptions{CAFile: *serverCA})
	} else {
		cfg, rerr := flags.Resolve(set)
		if rerr != nil {
			fmt.Fprintf(stderr, "provider history: invalid configuration:\n%v\n", rerr)
			return 1
		}
		if h, err = server.OfflineHistory(ctx, cfg, q); err == nil {
			body, err = jsonhistory.Marshal(h)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "provider history: %v\n", err)
		return 1
	}
	if *asJSON {
		_, err = stdout.Write(body)
	} else {
		err = jsonhistory.Write(stdout, h)
	}
	if err != nil {
		fmt.Fprintf(stderr, "provider history: %v\n", err)
		return 1
	}
	return 0
}
