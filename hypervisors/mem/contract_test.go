package mem

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/bigfleet-vm/provider/cli"
	"github.com/bigfleet-vm/provider/internal/providertest/contract"
	"github.com/bigfleet-vm/provider/plugin"
)

// providerEnv makes this test binary the provider, on a registry that
// holds mem alone.
const providerEnv = "BIGFLEET_MEM_PROVIDER=1"

func TestMain(m *testing.M) {
	if os.Getenv("BIGFLEET_MEM_PROVIDER") == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := cli.Run(ctx, plugin.MustRegistry(Plugin()), os.Args[1:], os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// TestContract runs the black-box contract suite (what BigFleet expects
// on the wire, across kill -9, SIGTERM and fault modes) against the
// provider serving mem.
func TestContract(t *testing.T) {
	if testing.Short() {
		t.Skip("the contract suite runs the provider binary dozens of times")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	contract.Run(t, contract.Harness{
		Binary:        exe,
		Env:           []string{providerEnv},
		Args:          []string{"--hypervisor", "mem", "--use-fake-backend"},
		TypePrefix:    "mem.",
		CreateActions: []string{actionCreate},
		Provider:      "mem",
	})
}
