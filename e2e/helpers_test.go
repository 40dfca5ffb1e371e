package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// pollDeadline bounds every wait for asynchronous state.
const pollDeadline = providertest.SettleDeadline

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
	checkShape   = providertest.CheckShape
)

// offeringsFile writes a one-offering file for the shape's small type in
// its first zone and returns its path.
func offeringsFile(t testing.TB, sh shape, capacity string, count int, labels map[string]string) string {
	t.Helper()
	off := []map[string]any{{"instance_type": sh.typePrefix + "small", "zone": sh.zone, "capacity_type": capacity, "count": count}}
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

func sleepPoll() { time.Sleep(15 * time.Millisecond) }

func list(t testing.TB, c pb.CapacityProviderClient, f *pb.ListFilter) *pb.MachineList {
	t.Helper()
	l, err := c.List(ctx(t), f)
	if err != nil {
		t.Fatalf("List(%v): %v", f, err)
	}
	return l
}
