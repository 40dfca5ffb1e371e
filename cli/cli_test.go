package cli

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
	code = run(context.Background(), registry(), args, &o, &e)
	return o.String(), e.String(), code
}

// TestHelpExitsZero asks every subcommand for help: each prints it and
// exits 0, never "invalid configuration: ... help requested".
func TestHelpExitsZero(t *testing.T) {
	tests := []struct {
		args []string
		want string // in stdout+stderr
	}{
		{[]string{"help"}, "pve-sim"},
		{[]string{"-h"}, "--metrics-addr"},
		{[]string{"--help"}, "--metrics-addr"},
		{[]string{"serve", "-h"}, "--metrics-addr"},
		{[]string{"serve", "--help"}, "--fake-admin"},
		{[]string{"plan", "-h"}, "--server-ca"},
		{[]string{"pve-sim", "-h"}, "-nodes"},
		{[]string{"help", "serve"}, "--metrics-tls"},
		{[]string{"help", "plan"}, "--detailed-exitcode"},
		{[]string{"help", "pve-sim"}, "-template-vmid"},
		{[]string{"version"}, "provider"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			out, errOut, code := runArgs(t, tt.args...)
			all := out + errOut
			if code != 0 {
				t.Errorf("exit %d, want 0:\n%s", code, all)
			}
			if !strings.Contains(all, tt.want) {
				t.Errorf("output lacks %q:\n%s", tt.want, all)
			}
			for _, bad := range []string{"invalid configuration", "help requested"} {
				if strings.Contains(all, bad) {
					t.Errorf("output says %q:\n%s", bad, all)
				}
			}
		})
	}
	// `provider help SUBCOMMAND` is help output: it goes to stdout.
	if out, _, _ := runArgs(t, "help", "plan"); !strings.Contains(out, "--server") {
		t.Errorf("provider help plan printed nothing on stdout")
	}
}

func TestUnknownSubcommandListsThemAll(t *testing.T) {
	_, errOut, code := runArgs(t, "frobnicate")
	if code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
	for _, s := range []string{`"frobnicate"`, "serve", "plan", "pve-sim", "version", "help"} {
		if !strings.Contains(errOut, s) {
			t.Errorf("the error lacks %q:\n%s", s, errOut)
		}
	}
}

// makeState starts no server: it assembles one on state, records a
// pending Create and closes it, as a provider that stopped would leave it.
func makeState(t *testing.T, state string) {
	t.Helper()
	ctx := context.Background()
	cfg, err := config.Parse(registry(), []string{"--use-fake-backend", "--state", state, "--seed-count", "4", "--addr", "127.0.0.1:0", "--metrics-addr", ""}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	p, err := server.Build(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := p.Document()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := doc.Mutate(ctx, desired.Request{Kind: desired.KindCreate, MachineID: cfg.Slots[0].ID}); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestPlanStateMustExist(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	makeState(t, state)
	tests := []struct {
		name     string
		state    string
		wantCode int
		want     string
	}{
		{"typo in the path", filepath.Join(dir, "stat"), 1, "no state file there"},
		{"missing directory", filepath.Join(dir, "nope", "state"), 1, "no state file there"},
		{"existing state with a pending create", state, 2, "to create"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code := runArgs(t, "plan", "--use-fake-backend", "--seed-count", "4", "--no-color", "--detailed-exitcode", "--state", tt.state)
			if code != tt.wantCode || !strings.Contains(out+errOut, tt.want) {
				t.Errorf("exit %d (want %d), want %q in:\n%s%s", code, tt.wantCode, tt.want, out, errOut)
			}
		})
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

// TestHistoryRefusesBadQueries: a query that cannot be answered gets a
// clear error and exit 1; a machine's history is read offline from the
// state, read-only.
func TestHistoryRefusesBadQueries(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	makeState(t, state)
	flags := []string{"--use-fake-backend", "--seed-count", "4", "--state", state}
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"nothing asked", nil, "name a machine"},
		{"machine and fleet filters", []string{"local-a/kvm.large/000", "--since", "1m"}, "takes no --since"},
		{"unknown state", []string{"--since", "1m", "--machine-state", "BROKEN"}, "not a machine state"},
		{"since too long", []string{"--since", "1000h"}, "since must be between"},
		{"two machines", []string{"a", "b"}, "unexpected argument"},
		{"no state there", []string{"x", "--use-fake-backend", "--state", state + ".typo"}, "no state there"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"history"}, tt.args...)
			if tt.name != "no state there" {
				args = append(args, flags...)
			}
			out, errOut, code := runArgs(t, args...)
			if code != 1 || !strings.Contains(errOut, tt.want) {
				t.Errorf("exit %d, want 1 and %q in:\n%s%s", code, tt.want, out, errOut)
			}
		})
	}
	// The Create makeState accepted is there.
	out, errOut, code := runArgs(t, append([]string{"history", "local-a/kvm.large/000"}, flags...)...)
	if code != 0 || !strings.Contains(out, "SPECULATIVE → CREATING") {
		t.Errorf("exit %d:\n%s%s", code, out, errOut)
	}
}
