package desired

import (
	"slices"
	"strings"
)

// Warm is a warm standby's copy of the document kept ready to open: every
// machine record is decoded, validated and indexed (by id, by revision,
// against this process's offerings) as the store's changes arrive, so a
// term that starts from it does work in proportion to what differs from
// the offerings (new or changed slots, machines without one, interrupted
// transitions), not to the fleet.
//
// Put and Delete take the store's changes in commit order (a follower
// calls them under its own lock), and Settle ends each consistent cut (a
// whole load, or one watch response: within one, records come in no
// particular order of revision). Once handed to Open (Options.Warm) the
// Warm is the document's and must not be changed again. It holds one
// decoded value per machine record and, beyond the records, an index
// entry per machine: nothing grows but with the document.
type Warm struct {
	slots  []Slot
	slotAt map[string]int // slot id → its index in slots

	machines map[string]*Machine // the valid machine records, by id
	bad      map[string]error    // machine keys whose record Open would refuse, and why
	// log has the settled machines in revision order; pending the values
	// put since the last Settle, in arrival order (one overwritten or
	// deleted since is no longer its machine's value in machines, and is
	// skipped).
	log     *revlog
	pending []*Machine
	fences  map[string]struct{} // fence mark keys
	// pick are the machines Open must look at: no slot, a slot that
	// differs (in anything slotMatches compares, or in zone or type), or
	// an intent to re-drive. withSlot counts the machines with a slot.
	pick     map[string]struct{}
	withSlot int
}

// NewWarm starts an empty copy classified against slots, which must be
// the very slice later given to Open (Open uses the copy only then).
func NewWarm(slots []Slot) *Warm {
	w := &Warm{slots: slots, slotAt: make(map[string]int, len(slots)), machines: map[string]*Machine{},
		bad: map[string]error{}, log: newRevlog(0), fences: map[string]struct{}{}, pick: map[string]struct{}{}}
	for i, s := range slots {
		w.slotAt[s.ID] = i
	}
	return w
}

// Put takes a stored key's new value.
func (w *Warm) Put(key string, value []byte) {
	switch {
	case strings.HasPrefix(key, keyMachine):
		w.Delete(key)
		m, err := prepare(key, value)
		if err != nil {
			w.bad[key] = err
			return
		}
		w.machines[m.ID] = m
		w.pending = append(w.pending, m)
		if i, ok := w.slotAt[m.ID]; ok {
			w.withSlot++
			if s := w.slots[i]; m.Zone == s.Zone && m.InstanceType == s.InstanceType && slotMatches(m, s) && m.Intent == nil {
				return
			}
		}
		w.pick[m.ID] = struct{}{}
	case strings.HasPrefix(key, keyFence):
		w.fences[key] = struct{}{}
	}
}

// Delete takes a stored key's deletion.
func (w *Warm) Delete(key string) {
	switch {
	case strings.HasPrefix(key, keyMachine):
		delete(w.bad, key)
		id := key[len(keyMachine):]
		if _, ok := w.machines[id]; !ok {
			return
		}
		delete(w.machines, id)
		delete(w.pick, id)
		if _, ok := w.slotAt[id]; ok {
			w.withSlot--
		}
		w.log.remove(id)
	case strings.HasPrefix(key, keyFence):
		delete(w.fences, key)
	}
}

// Settle ends a consistent cut: the machines put since the last one go
// into the revision order. A cut that holds records below one settled
// before (a large commit whose parts the store wrote in parallel, such as
// the first write of a whole fleet) is merged into the order from its
// oldest record on, which is near the newest: a standby following such a
// write does work in proportion to the write, not to the fleet for each
// of its parts (it re-sorted all 100,000 machines for each of 181 parts).
func (w *Warm) Settle() {
	if len(w.pending) == 0 {
		return
	}
	ms := w.pending[:0]
	for _, m := range w.pending {
		if w.machines[m.ID] == m {
			ms = append(ms, m)
		}
	}
	if len(ms) > 0 {
		sortByRev(ms)
		w.log.insert(ms)
	}
	clear(w.pending) // no pointers kept past the cut
	if cap(w.pending) > maxPendingKept {
		w.pending = nil // a load's worth: not kept for the cuts that follow
	} else {
		w.pending = w.pending[:0]
	}
}

// maxPendingKept bounds the pending slice a Warm keeps between cuts.
const maxPendingKept = 4096

// load is what Open reads of the copy; stored must be the values the copy
// was built from (the follower hands both over together).
func (w *Warm) load(ld *loaded) error {
	if len(w.bad) > 0 {
		keys := make([]string, 0, len(w.bad))
		for k := range w.bad {
			keys = append(keys, k)
		}
		return w.bad[slices.Min(keys)]
	}
	w.Settle()
	ld.byID, ld.pick, ld.slotAt, ld.withSlot, ld.log = w.machines, w.pick, w.slotAt, w.withSlot, w.log
	// The newest stored machine's revision, as a full load counts it.
	for i := len(w.log.entries) - 1; i >= 0; i-- {
		if e := w.log.entries[i]; !e.dead {
			ld.meta.Rev = max(ld.meta.Rev, e.m.Rev)
			break
		}
	}
	return nil
}
