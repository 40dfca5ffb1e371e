package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvespec"
	"github.com/bigfleet-vm/provider/internal/providertest"
	"github.com/bigfleet-vm/provider/internal/providertest/contract"
)

// binary is the provider built once by TestMain.
var binary string

func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	bin, cleanup, err := providertest.Build("provider-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer cleanup()
	binary = bin
	defer stopBench()
	return m.Run()
}

// shape is one simulator shape: the contract suite runs against each,
// and the few hypervisor-specific tests below compare them.
type shape struct {
	name string
	args []string
	// typePrefix and zone are the shape's instance types' prefix and
	// its simulator's first zone.
	typePrefix, zone string
	// creates are the plan actions that create a VM.
	creates []string
}

var shapes = []shape{
	{name: "libvirt", typePrefix: "kvm.", zone: "local-a", creates: []string{lvspec.ActionDefine}},
	{name: "proxmox", args: []string{"--hypervisor", "proxmox"}, typePrefix: "pve.", zone: "pve-a", creates: []string{pvespec.ActionClone}},
}

// TestContract runs the black-box contract suite against each shape, the
// shapes in parallel (each shape's tests one after the other).
func TestContract(t *testing.T) {
	for _, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			t.Parallel()
			contract.Run(t, contract.Harness{
				Binary:        binary,
				Args:          append([]string{"--use-fake-backend"}, sh.args...),
				TypePrefix:    sh.typePrefix,
				CreateActions: sh.creates,
				Provider:      sh.name,
			})
		})
	}
}

// eachShape runs f as a parallel subtest per simulator shape.
func eachShape(t *testing.T, f func(t *testing.T, sh shape)) {
	t.Helper()
	for _, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			t.Parallel()
			f(t, sh)
		})
	}
}

// server is the provider with the fake backend plus its stable client.
type server struct {
	*providertest.Provider
	c pb.CapacityProviderClient
}

// start launches the provider with the fake backend on free loopback ports
// and waits for /readyz; it is killed when the test ends. args come after
// the harness's own flags, so they win.
func start(t testing.TB, args ...string) *server {
	t.Helper()
	return startWith(t, providertest.Options{}, args)
}

// startWith is start with the harness's options (a Detached server outlives
// its test).
func startWith(t testing.TB, o providertest.Options, args []string) *server {
	t.Helper()
	o.Args = append([]string{"serve", "--use-fake-backend", "--log-level", "warn"}, args...)
	o.Dial = []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20), grpc.MaxCallRecvMsgSize(1<<30))}
	p := providertest.Start(t, binary, o)
	return &server{Provider: p, c: p.Client()}
}

// ctx returns a per-call context with a generous deadline.
func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

func code(err error) codes.Code { return status.Code(err) }

// runExit runs `provider serve --use-fake-backend <args>` expecting it to
// exit by itself (startup validation), and returns its combined output and
// exit code. It fails the test if the process is still running (listening)
// after a generous deadline.
func runExit(t testing.TB, args ...string) (string, int) {
	t.Helper()
	ports := providertest.FreeAddrs(t, 2)
	all := append([]string{"serve", "--use-fake-backend", "--addr", ports[0], "--metrics-addr", ports[1]}, args...)
	return runRaw(t, all...)
}

func runRaw(t testing.TB, args ...string) (string, int) {
	t.Helper()
	return providertest.Run(t, binary, 30*time.Second, args...)
}
