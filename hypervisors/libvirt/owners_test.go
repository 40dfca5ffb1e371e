package libvirt

import (
	"fmt"
	"testing"
	"time"
)

// TestOwnersStayFlat: domains defined and undefined between listings
// (issue 18: their owner notes stayed for the adapter's life) are
// forgotten by the next listing of their zone, while a note made after
// the listing started, a listed domain's note and other zones' notes stay.
func TestOwnersStayFlat(t *testing.T) {
	now := time.Unix(1000, 0)
	h := &Hypervisor{owners: map[string]ownerNote{}, now: func() time.Time { return now }}
	h.setOwner("a", "listed", "m-listed")
	h.setOwner("b", "other-zone", "m-b")
	peak := 0
	for cycle := range 50 {
		for i := range 20 { // defined and undefined between two listings
			h.setOwner("a", fmt.Sprintf("vm-%d-%d", cycle, i), fmt.Sprintf("m-%d", i))
			now = now.Add(time.Millisecond)
		}
		peak = max(peak, len(h.owners))
		listing := now
		now = now.Add(time.Millisecond)
		h.setOwner("a", "defined-during-the-listing", "m-new")
		h.pruneOwners("a", map[string]bool{"listed": true}, listing)
		if n := len(h.owners); n != 3 {
			t.Fatalf("cycle %d: %d owner notes after the listing, want 3: %v", cycle, n, h.owners)
		}
		now = now.Add(time.Millisecond)
	}
	for _, k := range [][2]string{{"a", "listed"}, {"b", "other-zone"}, {"a", "defined-during-the-listing"}} {
		if h.owner(k[0], k[1]) == "" {
			t.Errorf("the note of %s/%s is gone", k[0], k[1])
		}
	}
	if peak > 23 {
		t.Errorf("peak %d notes: they grow across listings", peak)
	}
}
