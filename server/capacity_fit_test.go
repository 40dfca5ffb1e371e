package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/capacity"
	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/internal/planschema"
	"github.com/bigfleet-vm/provider/jsonplan"
)

func smallSpec(name string) (int, int, bool) {
	if name == "small" {
		return 2, 4096, true
	}
	return 0, 0, false
}

// TestHostFit holds a Create against its zone's newest reading and what
// the zone's other machines hold, and names a hypervisor's refusal for
// lack of resources with the figures it has.
func TestHostFit(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	latest := &capacity.Latest{}
	latest.Record([]string{"a", "cpu", "bad", "none"}, map[string]hypervisors.HostCapacity{
		"a":   {CPUs: 64, MemoryBytes: 8 << 30, StorageName: "default", DiskBytes: 1 << 30, DiskFreeBytes: 100 << 20},
		"cpu": {CPUs: 2, MemoryBytes: 64 << 30},
	}, map[string]error{"bad": errors.New("unreachable")}, at)
	self := func(zone string) *desired.Machine {
		return &desired.Machine{ID: "m", Zone: zone, InstanceType: "small", State: desired.Creating}
	}
	// machines is the pass's document: the machine itself (CREATING), n
	// machines per state in zone, and some that do not count there.
	machines := func(zone string, states map[desired.State]int) []*desired.Machine {
		out := []*desired.Machine{self(zone)}
		i := 0
		for s, n := range states {
			for range n {
				i++
				out = append(out, &desired.Machine{ID: fmt.Sprintf("o%04d", i), Zone: zone, InstanceType: "small", State: s})
			}
		}
		out = append(out, &desired.Machine{ID: "x1", Zone: "elsewhere", InstanceType: "small", State: desired.Idle},
			&desired.Machine{ID: "x2", Zone: zone, InstanceType: "unknown-type", State: desired.Idle})
		slices.SortFunc(out, func(a, b *desired.Machine) int { return strings.Compare(a.ID, b.ID) })
		return out
	}
	memErr := fmt.Errorf("start: %w", &hypervisors.ResourceError{Resource: "memory", Err: errors.New("Cannot allocate memory")})
	diskErr := fmt.Errorf("create-overlay: %w", &hypervisors.ResourceError{Resource: "disk", Err: errors.New("No space left on device")})
	tests := []struct {
		name   string
		zone   string
		states map[desired.State]int
		ratio  float64
		err    error
		want   string
	}{
		{"fits exactly", "a", map[desired.State]int{desired.Idle: 1}, 1, nil, ""},
		{"memory short", "a", map[desired.State]int{desired.Idle: 1, desired.Deleting: 1}, 1, nil,
			"host memory: zone a has 0 MiB free, the machine needs 4096 MiB"},
		{"memory is never overcommitted", "a", map[desired.State]int{desired.Idle: 1, desired.Configured: 1}, 10, nil,
			"host memory: zone a has 0 MiB free, the machine needs 4096 MiB"},
		{"SPECULATIVE and FAILED hold nothing", "a", map[desired.State]int{desired.Speculative: 10, desired.Failed: 10}, 1, nil, ""},
		{"cpu within the ratio", "cpu", map[desired.State]int{}, 1, nil, ""},
		{"cpu past the ratio", "cpu", map[desired.State]int{desired.Idle: 1}, 1.5, nil,
			"host cpu: zone cpu has 1 vCPUs free (2 CPUs × overcommit 1.5), the machine needs 2 vCPUs"},
		{"cpu overcommitted by the ratio", "cpu", map[desired.State]int{desired.Idle: 1}, 2, nil, ""},
		{"unread zone is not checked", "unread", map[desired.State]int{desired.Idle: 100}, 1, nil, ""},
		{"failed read is not checked", "bad", map[desired.State]int{desired.Idle: 100}, 1, nil, ""},
		{"empty reading is not checked", "none", map[desired.State]int{desired.Idle: 100}, 1, nil, ""},
		{"hypervisor out of memory", "a", map[desired.State]int{}, 1, memErr,
			"host memory: zone a has 8192 MiB free, the machine needs 4096 MiB; the hypervisor refused: " + memErr.Error()},
		{"hypervisor out of memory, unread", "bad", map[desired.State]int{}, 1, memErr,
			"host memory: zone bad cannot hold the machine's 4096 MiB (no capacity reading of the zone); the hypervisor refused: " + memErr.Error()},
		{"pool full", "a", map[desired.State]int{}, 1, diskErr,
			"storage pool space: zone a pool default had 100 MiB free at its newest reading; the hypervisor refused: " + diskErr.Error()},
		{"pool full, no pool read", "cpu", map[desired.State]int{}, 1, diskErr,
			"storage pool space: zone cpu has run out of storage space (no reading of its pool); the hypervisor refused: " + diskErr.Error()},
		{"another error", "a", map[desired.State]int{}, 1, errors.New("boom"), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLedger(smallSpec)
			l.pass(machines(tt.zone, tt.states))
			fit := hostFit(latest, l, smallSpec, tt.ratio, true)
			if got := fit(self(tt.zone), tt.err); got != tt.want {
				t.Errorf("hostFit = %q\nwant      %q", got, tt.want)
			}
		})
	}
	// Under warn (holdCPU false) vCPUs past the ratio are the operator's
	// call; memory is still held.
	for _, tt := range []struct {
		name, zone string
		states     map[desired.State]int
		want       string
	}{
		{"cpu past the ratio under warn", "cpu", map[desired.State]int{desired.Idle: 1}, ""},
		{"memory short under warn", "a", map[desired.State]int{desired.Idle: 1, desired.Deleting: 1},
			"host memory: zone a has 0 MiB free, the machine needs 4096 MiB"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := newLedger(smallSpec)
			l.pass(machines(tt.zone, tt.states))
			if got := hostFit(latest, l, smallSpec, 1.5, false)(self(tt.zone), nil); got != tt.want {
				t.Errorf("hostFit = %q\nwant      %q", got, tt.want)
			}
		})
	}
}

// TestCapacitySection: each zone's offered and running figures with its
// host, ratios and the resources over the allowed ratio; a zone not read,
// whose read failed or that reported nothing, or an adapter that cannot
// read, says so with no host figures. The plan carrying it is 1.2 and
// valid against the published schema.
func TestCapacitySection(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	latest := &capacity.Latest{}
	latest.Record([]string{"a", "bad", "none"}, map[string]hypervisors.HostCapacity{
		"a": {CPUs: 3, MemoryBytes: 16 << 30, StorageName: "default", DiskBytes: 10 << 30, DiskFreeBytes: 0},
	}, map[string]error{"bad": errors.New("read capacity of zone bad: unreachable")}, at)
	var machines []*desired.Machine
	for i, st := range []desired.State{desired.Speculative, desired.Idle, desired.Creating, desired.Speculative} {
		machines = append(machines, &desired.Machine{ID: fmt.Sprint(i), Zone: "a", InstanceType: "small", State: st})
	}
	machines = append(machines, &desired.Machine{ID: "b", Zone: "bad", InstanceType: "small", State: desired.Idle})
	got := capacitySection([]string{"none", "unread", "bad", "a"}, true, latest, machines, smallSpec, 2)
	ratio := func(v float64) *float64 { return &v }
	want := &jsonplan.Capacity{MaxRatio: 2, Zones: []jsonplan.ZoneCapacity{
		{Zone: "a", Status: "ok", ReadAt: &at,
			Host:    &jsonplan.Host{CPUs: 3, MemoryBytes: 16 << 30, Disk: &jsonplan.Disk{Storage: "default", TotalBytes: 10 << 30, FreeBytes: 0}},
			Offered: jsonplan.Resources{VCPU: 8, MemoryBytes: 16 << 30}, Running: jsonplan.Resources{VCPU: 4, MemoryBytes: 8 << 30},
			CPURatio: ratio(2.667), MemoryRatio: ratio(1), Over: []string{"cpu"}},
		{Zone: "bad", Status: "unknown", Error: "read capacity of zone bad: unreachable",
			Offered: jsonplan.Resources{VCPU: 2, MemoryBytes: 4 << 30}, Running: jsonplan.Resources{VCPU: 2, MemoryBytes: 4 << 30}},
		{Zone: "none", Status: "unknown", Error: "the host reported no capacity"},
		{Zone: "unread", Status: "unknown", Error: capacityUnread},
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("capacitySection (-want +got):\n%s", diff)
	}
	b, err := jsonplan.Marshal(&jsonplan.Plan{Hypervisor: "libvirt", Installation: "i", Zones: []jsonplan.Zone{}, Changes: []jsonplan.Change{}, Drift: []jsonplan.Drift{}, Capacity: got})
	if err != nil {
		t.Fatal(err)
	}
	if err := planschema.Validate(b); err != nil {
		t.Errorf("a plan with this section is invalid: %v\n%s", err, b)
	}
	none := capacitySection([]string{"a"}, false, latest, machines, smallSpec, 1)
	if z := none.Zones[0]; z.Status != "unknown" || z.Host != nil || z.Error != "this hypervisor cannot read its hosts' capacity" {
		t.Errorf("an adapter that cannot read: %+v", z)
	}
}

// TestOfflinePlanCapacity: `provider plan` reads the simulated hosts and
// carries the capacity section (format 1.2); under --capacity-check=off
// it reads nothing and the plan is 1.1 as before.
func TestOfflinePlanCapacity(t *testing.T) {
	for _, tc := range []struct {
		check   string
		section bool
	}{{"warn", true}, {"refuse", true}, {"off", false}} {
		t.Run(tc.check, func(t *testing.T) {
			cfg, err := config.Parse(testReg, []string{"--use-fake-backend", "--seed-count", "3", "--addr", "127.0.0.1:0", "--metrics-addr", "",
				"--fake-host-cpus", "4", "--fake-host-memory-gib", "8", "--capacity-check", tc.check, "--capacity-overcommit", "1.5"}, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			p, err := OfflinePlanJSON(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			b, err := jsonplan.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := planschema.Validate(b); err != nil {
				t.Fatalf("invalid plan: %v", err)
			}
			if !tc.section {
				if p.Capacity != nil || jsonplan.VersionFor(p) != "1.1" {
					t.Fatalf("capacity under off: %+v (version %s)", p.Capacity, jsonplan.VersionFor(p))
				}
				return
			}
			if p.Capacity == nil || len(p.Capacity.Zones) != len(cfg.Zones) || p.Capacity.MaxRatio != 1.5 || jsonplan.VersionFor(p) != "1.2" {
				t.Fatalf("capacity section %+v", p.Capacity)
			}
			for _, z := range p.Capacity.Zones {
				if z.Status != "ok" || z.Host == nil || z.Host.CPUs != 4 || z.Host.MemoryBytes != 8<<30 || z.Offered.VCPU == 0 || z.CPURatio == nil {
					t.Errorf("zone %+v: want the simulated host of 4 CPUs and 8 GiB against the offerings", z)
				}
			}
		})
	}
}

// BenchmarkHostFit100k is the cost the Create check adds to one Create
// in a document of 100,000 machines: one pass over the document's
// per-zone counts, no hypervisor call.
func BenchmarkHostFit100k(b *testing.B) {
	cfg, err := config.Parse(testReg, []string{"--use-fake-backend", "--seed-count", "100000", "--addr", "127.0.0.1:0", "--metrics-addr", "",
		"--fake-host-cpus", "100000", "--fake-host-memory-gib", "1000000"}, io.Discard)
	if err != nil {
		b.Fatal(err)
	}
	p, err := Build(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	tm := p.current()
	m := tm.doc.All()[0]
	tm.latest.Record([]string{m.Zone}, map[string]hypervisors.HostCapacity{m.Zone: {CPUs: 100000, MemoryBytes: 1 << 50}}, nil, time.Now())
	l := newLedger(tm.types)
	l.pass(tm.doc.All())
	fit := hostFit(tm.latest, l, tm.types, 1, true)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if s := fit(m, nil); s != "" {
			b.Fatal(s)
		}
	}
}

// TestLedgerCountsAdmittedCreates: Creates admitted between two passes
// are counted together (the second of two that each fit alone is
// refused); a pass that counts the first drops its reservation without
// counting it twice, keeps one whose machine it still saw SPECULATIVE,
// and forgets a machine that FAILED.
func TestLedgerCountsAdmittedCreates(t *testing.T) {
	latest := &capacity.Latest{}
	latest.Record([]string{"a"}, map[string]hypervisors.HostCapacity{"a": {CPUs: 64, MemoryBytes: 8 << 30}}, nil, time.Now())
	m := func(id string, st desired.State) *desired.Machine {
		return &desired.Machine{ID: id, Zone: "a", InstanceType: "small", State: st}
	}
	l := newLedger(smallSpec)
	l.pass([]*desired.Machine{m("1", desired.Speculative), m("2", desired.Speculative), m("3", desired.Speculative)})
	fit := hostFit(latest, l, smallSpec, 1, true)
	if got := fit(m("1", desired.Creating), nil); got != "" {
		t.Fatalf("first Create: %q", got)
	}
	if got := fit(m("2", desired.Creating), nil); got != "" {
		t.Fatalf("second Create: %q", got)
	}
	const full = "host memory: zone a has 0 MiB free, the machine needs 4096 MiB"
	if got := fit(m("3", desired.Creating), nil); got != full {
		t.Fatalf("third Create of 4 GiB on an 8 GiB host holding two: %q, want %q", got, full)
	}
	if got := fit(m("1", desired.Creating), nil); got != "" {
		t.Fatalf("the first asked again (its own reservation is not counted against it): %q", got)
	}
	// The pass saw 1 CREATING (counted: its reservation goes), 2 still
	// SPECULATIVE (its Create came after the pass's read: kept).
	l.pass([]*desired.Machine{m("1", desired.Creating), m("2", desired.Speculative), m("3", desired.Speculative)})
	if got := fit(m("3", desired.Creating), nil); got != full {
		t.Fatalf("after a pass: %q, want %q (1 counted once, 2 still reserved)", got, full)
	}
	// 1 FAILED: it holds nothing any more.
	l.pass([]*desired.Machine{m("1", desired.Failed), m("2", desired.Creating), m("3", desired.Speculative)})
	if got := fit(m("3", desired.Creating), nil); got != "" {
		t.Fatalf("after 1 FAILED: %q, want it to fit", got)
	}
	if n := len(l.reserved); n != 1 {
		t.Errorf("%d reservations, want 1 (3's)", n)
	}
}
