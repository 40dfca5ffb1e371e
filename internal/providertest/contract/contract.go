package contract

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// Harness is how to run one hypervisor's provider on its simulator.
type Harness struct {
	// Binary is the provider binary (or a test binary that is the
	// provider when Env says so).
	Binary string
	// Env are extra environment variables (KEY=value) for every run of
	// Binary.
	Env []string
	// Args select the hypervisor and its simulator; they follow the
	// subcommand of every run ("serve", "plan", "history") and come
	// before each test's own flags: e.g. --hypervisor proxmox
	// --use-fake-backend.
	Args []string
	// TypePrefix is the prefix of the hypervisor's instance types in an
	// offerings file ("kvm.", "pve."); its "small" type is used.
	TypePrefix string
	// CreateActions are the plan actions that create a VM ("define",
	// "clone"): creations are counted on
	// bigfleet_provider_executor_steps_total{action,outcome="ok"}.
	CreateActions []string
	// Provider is the host.provider a placed machine must report; empty
	// accepts any non-empty one.
	Provider string
}

// test is one contract test.
type test struct {
	name string
	run  func(t *testing.T, h Harness)
}

// tests are the contract, in the order Run runs them.
var tests = []test{
	{"Faults", testFaults},
	{"FailedIsSticky", testFailedIsSticky},
	{"CreateFaultOffering", testCreateFaultOffering},
	{"PlainFakeFaultsConvention", testPlainFakeFaultsConvention},
	{"FencingOracle", testFencingOracle},
	{"FencingRules", testFencingRules},
	{"CursorlessPagesHandOutDifferentMachines", testCursorlessPagesHandOutDifferentMachines},
	{"EmptyBlobAndFailedConfigure", testEmptyBlobAndFailedConfigure},
	{"HistoryOfAMachineAcrossKill9", testHistoryOfAMachineAcrossKill9},
	{"IdempotentRetries", testIdempotentRetries},
	{"ParallelRetriesCollapse", testParallelRetriesCollapse},
	{"ConflictingMutationsRace", testConflictingMutationsRace},
	{"LifecycleTrace", testLifecycleTrace},
	{"ErrorCodes", testErrorCodes},
	{"ListFilters", testListFilters},
	{"ListRevisionCursor", testListRevisionCursor},
	{"ListPaging", testListPaging},
	{"ShardMetadataVerbatim", testShardMetadataVerbatim},
	{"ConfigureCaps", testConfigureCaps},
	{"ShardMetadataInvalidUTF8", testShardMetadataInvalidUTF8},
	{"PlanAndDriftBlackBox", testPlanAndDriftBlackBox},
	{"RestartKill9", testRestartKill9},
	{"SIGTERMFlushes", testSIGTERMFlushes},
	{"Kill9RightAfterSettle", testKill9RightAfterSettle},
	{"GuestCommandNeverRunsTwiceAcrossKill9", testGuestCommandNeverRunsTwiceAcrossKill9},
	{"Kill9MidGuestCommandRunsItOnce", testKill9MidGuestCommandRunsItOnce},
	{"GracefulStopFinishesQueuedWork", testGracefulStopFinishesQueuedWork},
	{"StartupValidation", testStartupValidation},
	{"OfferingsShrink", testOfferingsShrink},
}

// Run runs the contract against the hypervisor h describes, one subtest
// per test, one after the other (a caller runs several hypervisors in
// parallel). It fails the test at once on an incomplete Harness.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Binary == "" || len(h.Args) == 0 || h.TypePrefix == "" || len(h.CreateActions) == 0 {
		t.Fatalf("contract.Run: the Harness needs a Binary, Args, a TypePrefix and CreateActions: %+v", h)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, h) })
	}
}

// pollDeadline bounds every wait for asynchronous state.
const pollDeadline = providertest.SettleDeadline

// runTimeout bounds a run of the binary that must exit by itself.
const runTimeout = 30 * time.Second

// server is the provider on its simulator plus its stable client.
type server struct {
	*providertest.Provider
	c pb.CapacityProviderClient
	h Harness
}

// start launches `provider serve` with h.Args then args (which win) on
// free loopback ports and waits for /readyz; it is killed when the test
// ends.
func (h Harness) start(t testing.TB, args ...string) *server {
	t.Helper()
	o := providertest.Options{Env: h.Env}
	o.Args = append(append([]string{"serve", "--log-level", "warn"}, h.Args...), args...)
	o.Dial = []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20), grpc.MaxCallRecvMsgSize(1<<30))}
	p := providertest.Start(t, h.Binary, o)
	return &server{Provider: p, c: p.Client(), h: h}
}

// runExit runs `provider serve` with h.Args then args, expecting it to
// exit by itself (startup validation), and returns its combined output
// and exit code.
func (h Harness) runExit(t testing.TB, args ...string) (string, int) {
	t.Helper()
	ports := providertest.FreeAddrs(t, 2)
	all := append(append([]string{"serve"}, h.Args...), "--addr", ports[0], "--metrics-addr", ports[1])
	return h.runRaw(t, append(all, args...)...)
}

// runRaw runs the binary with exactly args (and h.Env) to its exit.
func (h Harness) runRaw(t testing.TB, args ...string) (string, int) {
	t.Helper()
	return providertest.RunEnv(t, h.Binary, h.Env, runTimeout, args...)
}

// offeringsFile writes a one-offering file (the hypervisor's small type,
// in a zone of the test's own) and returns its path.
func (h Harness) offeringsFile(t testing.TB, capacity string, count int, labels map[string]string) string {
	t.Helper()
	off := []map[string]any{{"instance_type": h.TypePrefix + "small", "zone": "contract-a", "capacity_type": capacity, "count": count}}
	if labels != nil {
		off[0]["labels"] = labels
	}
	b, err := json.Marshal(off)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "offerings.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// vmCreates counts the VMs the provider created: the successful steps of
// the hypervisor's create actions.
func (s *server) vmCreates() float64 {
	var n float64
	for _, a := range s.h.CreateActions {
		n += s.Metric("bigfleet_provider_executor_steps_total", `action="`+a+`"`, `outcome="ok"`)
	}
	return n
}

func (s *server) bootstraps() float64 {
	return s.Metric("bigfleet_provider_executor_steps_total", `action="exec-bootstrap"`, `outcome="ok"`)
}

// tok is a fencing token; the zero value is "unfenced".
type tok = providertest.Token

// The mutations, fenced by a tok.
var (
	create    = providertest.Create
	configure = providertest.Configure
	drain     = providertest.Drain
	del       = providertest.Delete
)

// The toolkit's other helpers, by the names the tests use.
var (
	speculative  = providertest.Speculative
	toIdle       = providertest.ToIdle
	toConfigured = providertest.ToConfigured
	waitSettled  = providertest.WaitSettled
	stable       = providertest.Stable
	checkShape   = providertest.CheckShape
)

// ctx returns a per-call context with a generous deadline.
func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

func code(err error) codes.Code { return status.Code(err) }

// protoDiff compares messages with go-cmp.
func protoDiff(want, got any) string { return cmp.Diff(want, got, protocmp.Transform()) }

func sleepPoll() { time.Sleep(15 * time.Millisecond) }

func get2(s *server, id string) (*pb.Machine, error) {
	return s.c.Get(ctx(s.T()), &pb.MachineRef{Id: id})
}
