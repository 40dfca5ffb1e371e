package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/internal/planschema"
	"github.com/bigfleet-vm/provider/server"
)

func runArgs(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(context.Background(), args, &o, &e)
	return o.String(), e.String(), code
}

// makeState starts no server: it assembles one on state, records a
// pending Create and closes it, as a provider that stopped would leave it.
func makeState(t *testing.T, state string) {
	t.Helper()
	ctx := context.Background()
	cfg, err := config.Parse([]string{"--use-fake-backend", "--state", state, "--seed-count", "4", "--addr", "127.0.0.1:0", "--metrics-addr", ""}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	p, err := server.Build(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Doc.Mutate(ctx, desired.Request{Kind: desired.KindCreate, MachineID: cfg.Slots[0].ID}); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestPlanJSONValidatesAgainstTheSchema checks `provider plan --json`
// against docs/plan.schema.json, for a fresh installation and for one
// with a pending Create.
func TestPlanJSONValidatesAgainstTheSchema(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	makeState(t, state)
	for _, args := range [][]string{
		{"plan", "--json", "--use-fake-backend", "--seed-count", "4"},
		{"plan", "--json", "--use-fake-backend", "--seed-count", "4", "--hypervisor", "proxmox"},
		{"plan", "--json", "--use-fake-backend", "--seed-count", "4", "--state", state},
	} {
		out, errOut, code := runArgs(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d:\n%s", args, code, errOut)
		}
		if err := planschema.Validate([]byte(out)); err != nil {
			t.Errorf("%v: the plan does not validate: %v\n%s", args, err, out)
		}
		if strings.Contains(strings.Join(args, " "), "--state") && !strings.Contains(out, `"create-overlay"`) {
			t.Errorf("%v: the plan lacks the pending Create's steps:\n%s", args, out)
		}
	}
}
