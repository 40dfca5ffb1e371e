package statefile

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// TestRefusedRecordsKeepNothing runs many create/delete cycles, each with
// a record Apply refuses (over the size limit): every refusal stays an
// error for every Wait, also after later records are durable, it takes no
// sequence number from the records around it, and it keeps nothing in
// memory (issue 18: each one stayed in a set for the store's life). The
// allocation count of a refused Apply is the proof: zero, so there is
// nothing it could have kept.
func TestRefusedRecordsKeepNothing(t *testing.T) {
	f := mustOpen(t, statePath(t), Options{})
	defer mustClose(t, f)
	huge := []Op{{Key: "m/huge", Value: make([]byte, maxRecord+1)}} // never touched: no real memory
	var refusals []uint64
	for i := range 200 {
		key := fmt.Sprintf("m/%d", i)
		before := mustApply(t, f, put(key, "created"))
		r := f.Apply(huge...)
		refusals = append(refusals, r)
		after := mustApply(t, f, del(key))
		if after != before+1 && i == 0 {
			t.Errorf("the refusal took a sequence number (%d, then %d)", before, after)
		}
	}
	for _, r := range refusals {
		err := f.Wait(context.Background(), r)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("exceeds the %d-byte limit", maxRecord)) {
			t.Fatalf("Wait on a refused record after later ones are durable: %v", err)
		}
	}
	if got := f.Snapshot(); len(got) != 0 {
		t.Errorf("state after the cycles: %v", keys(got))
	}
	if allocs := testing.AllocsPerRun(1000, func() { f.Apply(huge...) }); allocs != 0 {
		t.Errorf("a refused Apply allocates %v times: it keeps something per refusal", allocs)
	}
}
