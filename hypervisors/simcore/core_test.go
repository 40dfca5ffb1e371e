package simcore

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/hypervisors"
)

// FailN fails exactly the first n calls of its op, and Chain stops at
// the first hook that fails.
func TestFailNAndChain(t *testing.T) {
	boom := errors.New("boom")
	var seen []string
	record := func(_ context.Context, c Call) error { seen = append(seen, c.Op); return nil }
	h := Chain(nil, FailN("Start", 2, boom), record)
	var got []error
	for _, op := range []string{"Start", "Observe", "Start", "Start"} {
		got = append(got, h(context.Background(), Call{Op: op}))
	}
	if d := cmp.Diff([]error{boom, nil, boom, nil}, got, cmp.Comparer(func(a, b error) bool { return errors.Is(a, b) })); d != "" {
		t.Errorf("errors (-want +got)\n%s", d)
	}
	if d := cmp.Diff([]string{"Observe", "Start"}, seen); d != "" {
		t.Errorf("calls past the failing hook (-want +got)\n%s", d)
	}
}

func TestMergeZones(t *testing.T) {
	got := MergeZones([]string{"b", "a"}, []string{"a", "z", "c", "z"})
	if d := cmp.Diff([]string{"b", "a", "c", "z"}, got); d != "" {
		t.Errorf("zones (-want +got)\n%s", d)
	}
}

// A core with no machines still accounts for calls and refuses them once
// closed; SetFlaky is bounded by the zones and ops it knows.
func TestCoreCalls(t *testing.T) {
	c := New(Options{}.WithDefaults(), Machines{})
	ctx := context.Background()
	if err := c.Enter(ctx, "Observe", "fake-a", hypervisors.Target{Zone: "fake-a"}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][2]string{{"fake-a", "Reboot"}, {"mars", "Start"}} {
		if err := c.SetFlaky([]string{"fake-a"}, bad[0], bad[1], true); !errors.Is(err, hypervisors.ErrInvalid) {
			t.Errorf("SetFlaky(%q, %q): %v, want ErrInvalid", bad[0], bad[1], err)
		}
	}
	c.Close()
	if err := c.Enter(ctx, "Observe", "fake-a", hypervisors.Target{Zone: "fake-a"}); !errors.Is(err, hypervisors.ErrUnreachable) {
		t.Errorf("call after Close: %v, want ErrUnreachable", err)
	}
	if d := cmp.Diff(map[string]int{"Observe": 2}, c.Calls()); d != "" {
		t.Errorf("calls (-want +got)\n%s", d)
	}
}
