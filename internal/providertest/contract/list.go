package contract

import (
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

func list(t testing.TB, c pb.CapacityProviderClient, f *pb.ListFilter) *pb.MachineList {
	t.Helper()
	l, err := c.List(ctx(t), f)
	if err != nil {
		t.Fatalf("List(%v): %v", f, err)
	}
	return l
}

func testListFilters(t *testing.T, h Harness) {
	s := h.start(t, "--seed-count", "12")
	sp := speculative(t, s.c, 4)
	toIdle(t, s.c, sp[0])
	toIdle(t, s.c, sp[1])
	toConfigured(t, s.c, sp[2], "c", nil)
	toConfigured(t, s.c, sp[3], "c", nil)
	all := providertest.ListAll(t, s.c)
	byState := map[pb.MachineState][]*pb.Machine{}
	for _, m := range all {
		byState[m.State] = append(byState[m.State], m)
	}
	tests := []struct {
		name   string
		states []pb.MachineState
		want   []*pb.Machine
	}{
		{"empty filter is all", nil, all},
		{"IDLE", []pb.MachineState{providertest.StIdle}, byState[providertest.StIdle]},
		{"CONFIGURED", []pb.MachineState{providertest.StConfigured}, byState[providertest.StConfigured]},
		{"SPECULATIVE", []pb.MachineState{providertest.StSpeculative}, byState[providertest.StSpeculative]},
		{"union IDLE+CONFIGURED", []pb.MachineState{providertest.StIdle, providertest.StConfigured}, append(slices.Clone(byState[providertest.StIdle]), byState[providertest.StConfigured]...)},
		{"union with an empty state", []pb.MachineState{providertest.StIdle, providertest.StFailed}, byState[providertest.StIdle]},
		{"duplicate states", []pb.MachineState{providertest.StIdle, providertest.StIdle}, byState[providertest.StIdle]},
		{"only an empty state", []pb.MachineState{providertest.StDeleting}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := list(t, s.c, &pb.ListFilter{States: tc.states}).Machines
			if diff := cmp.Diff(providertest.IDs(tc.want), providertest.IDs(got)); diff != "" {
				t.Errorf("ids (-want +got):\n%s", diff)
			}
		})
	}
	for _, tc := range []struct {
		max  int32
		want int
	}{{0, len(all)}, {1, 1}, {5, 5}, {int32(len(all)), len(all)}, {1000, len(all)}} {
		if got := len(list(t, s.c, &pb.ListFilter{MaxResults: tc.max}).Machines); got != tc.want {
			t.Errorf("max_results %d: %d machines, want %d", tc.max, got, tc.want)
		}
	}
	if got := len(list(t, s.c, &pb.ListFilter{MaxResults: 1, States: []pb.MachineState{providertest.StIdle, providertest.StConfigured}}).Machines); got != 1 {
		t.Errorf("max_results 1 with a filter: %d machines", got)
	}
}

func testListRevisionCursor(t *testing.T, h Harness) {
	s := h.start(t, "--seed-count", "8", "--reconcile-interval", "1s")
	sp := speculative(t, s.c, 2)
	toIdle(t, s.c, sp[0])
	full := list(t, s.c, &pb.ListFilter{})
	c0 := full.Revision
	if len(c0) == 0 {
		t.Fatal("List returned no revision cursor")
	}
	if got := list(t, s.c, &pb.ListFilter{SinceRevision: c0}); len(got.Machines) != 0 {
		t.Errorf("nothing changed, delta has %v", providertest.IDs(got.Machines))
	}
	// Idle reconcile ticks (every 1s) must not bump the cursor.
	for end := time.Now().Add(3500 * time.Millisecond); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		if got := list(t, s.c, &pb.ListFilter{SinceRevision: c0}); len(got.Machines) != 0 {
			t.Fatalf("idle reconcile ticks produced a delta: %v", providertest.IDs(got.Machines))
		}
	}
	providertest.Must(t, "create")(create(s.c, t, sp[1], tok{}))
	d := list(t, s.c, &pb.ListFilter{SinceRevision: c0})
	if !slices.Contains(providertest.IDs(d.Machines), sp[1]) {
		t.Errorf("machine mutated after the cursor is missing from the delta %v", providertest.IDs(d.Machines))
	}
	if slices.Contains(providertest.IDs(d.Machines), sp[0]) {
		t.Errorf("unchanged machine %s in the delta", sp[0])
	}
	providertest.WaitState(t, s.c, sp[1], providertest.StIdle, pollDeadline)
	c1 := list(t, s.c, &pb.ListFilter{}).Revision
	if got := list(t, s.c, &pb.ListFilter{SinceRevision: c1}); len(got.Machines) != 0 {
		t.Errorf("delta after settle: %v", providertest.IDs(got.Machines))
	}
	if got := list(t, s.c, &pb.ListFilter{SinceRevision: c0}); !slices.Contains(providertest.IDs(got.Machines), sp[1]) {
		t.Errorf("older cursor lost the change: %v", providertest.IDs(got.Machines))
	}
	// A rejected mutation changes nothing and bumps nothing.
	drain(s.c, t, sp[0], tok{})
	if got := list(t, s.c, &pb.ListFilter{SinceRevision: c1}); len(got.Machines) != 0 {
		t.Errorf("a rejected mutation produced a delta: %v", providertest.IDs(got.Machines))
	}

	// Garbage cursors are no cursor.
	corrupt := slices.Clone(c1)
	corrupt[len(corrupt)/2] ^= 0x5a
	other := h.start(t, "--seed-count", "8")
	foreign := list(t, other.c, &pb.ListFilter{}).Revision
	for name, cur := range map[string][]byte{
		"garbage":       []byte("not a cursor at all"),
		"empty":         {},
		"corrupted":     corrupt,
		"truncated":     c1[:len(c1)-1],
		"extended":      append(slices.Clone(c1), 0),
		"other lineage": foreign,
		"single byte":   {0},
		"all ones 64":   slices.Repeat([]byte{0xff}, 64),
	} {
		l, err := s.c.List(ctx(t), &pb.ListFilter{SinceRevision: cur})
		if err != nil {
			t.Errorf("%s cursor: %v", name, err)
			continue
		}
		if diff := cmp.Diff(providertest.IDs(full.Machines), providertest.IDs(l.Machines)); diff != "" {
			t.Errorf("%s cursor: not a full list (-want +got):\n%s", name, diff)
		}
	}
}

// walk pages through List with max_results and the returned revision.
func walk(t testing.TB, c pb.CapacityProviderClient, page int32, during func()) (seen map[string]int, pages int) {
	t.Helper()
	seen = map[string]int{}
	var cur []byte
	for {
		l := list(t, c, &pb.ListFilter{MaxResults: page, SinceRevision: cur})
		if len(l.Machines) > int(page) {
			t.Fatalf("page of %d machines exceeds max_results %d", len(l.Machines), page)
		}
		if len(l.Machines) == 0 {
			return seen, pages
		}
		pages++
		for _, m := range l.Machines {
			seen[m.Id]++
		}
		cur = l.Revision
		if during != nil {
			during()
		}
	}
}

func testListPaging(t *testing.T, h Harness) {
	s := h.start(t, "--seed-count", "300")
	all := providertest.IDs(providertest.ListAll(t, s.c))
	t.Run("quiet", func(t *testing.T) {
		seen, pages := walk(t, s.c, 7, nil)
		var dup []string
		for id, n := range seen {
			if n > 1 {
				dup = append(dup, id)
			}
		}
		if len(dup) > 0 {
			t.Errorf("duplicates: %v", dup)
		}
		got := make([]string, 0, len(seen))
		for id := range seen {
			got = append(got, id)
		}
		sort.Strings(got)
		if diff := cmp.Diff(all, got); diff != "" {
			t.Errorf("paged walk over %d pages differs from the full list (-want +got):\n%s", pages, diff)
		}
	})
	t.Run("while mutating", func(t *testing.T) {
		targets := speculative(t, s.c, 30)
		var mu sync.Mutex
		mutated := map[string]bool{}
		next := 0
		seen, _ := walk(t, s.c, 9, func() {
			// Between pages, start a Create on one machine; its
			// change (and later settle) re-deliver it, legitimately.
			if next < len(targets) {
				mu.Lock()
				mutated[targets[next]] = true
				mu.Unlock()
				providertest.Must(t, "create")(create(s.c, t, targets[next], tok{}))
				next++
			}
		})
		for _, id := range all {
			if seen[id] == 0 {
				t.Errorf("gap: %s never delivered", id)
			}
			if seen[id] > 1 && !mutated[id] {
				t.Errorf("duplicate: unchanged machine %s delivered %d times", id, seen[id])
			}
		}
		for _, id := range targets[:next] {
			providertest.WaitState(t, s.c, id, providertest.StIdle, pollDeadline)
		}
	})
}
