package desired

import (
	"sort"
)

// revlog keeps the committed machines in revision order for List. Changes
// commit in revision order, so appending keeps it sorted. A machine that
// is replaced or removed leaves a dead entry behind, skipped by readers
// and dropped by compact once dead entries outnumber live ones; pos maps
// each live machine to its entry. Machine values are never touched: the
// bookkeeping lives here, so published values stay immutable.
type revlog struct {
	entries []revEntry
	pos     map[string]int
	dead    int
}

type revEntry struct {
	m    *Machine
	dead bool
}

func newRevlog(n int) *revlog {
	return &revlog{entries: make([]revEntry, 0, n), pos: make(map[string]int, n)}
}

// put records m as its machine's newest value; revisions must ascend.
func (l *revlog) put(m *Machine) {
	l.remove(m.ID)
	l.pos[m.ID] = len(l.entries)
	l.entries = append(l.entries, revEntry{m: m})
}

// insert records ms, sorted by revision then id and each its machine's
// newest value (none with an entry: put removed it), in revision order
// among the entries. A cut whose revisions all follow the newest entry
// (a watch's usual one) is appended as put does; one that holds older
// revisions (a part of a large commit written in parallel, arriving after
// a newer part) moves only the entries from its oldest revision on,
// dropping dead ones on the way, so one just behind the newest costs
// little more.
func (l *revlog) insert(ms []*Machine) {
	from := sort.Search(len(l.entries), func(i int) bool { return revBefore(ms[0], l.entries[i].m) })
	if from == len(l.entries) {
		for _, m := range ms {
			l.put(m)
		}
		return
	}
	tail := l.entries[from:]
	merged := make([]revEntry, 0, len(tail)+len(ms))
	for i, j := 0, 0; i < len(tail) || j < len(ms); {
		switch {
		case i < len(tail) && tail[i].dead:
			l.dead--
			i++
		case j == len(ms) || i < len(tail) && revBefore(tail[i].m, ms[j]):
			merged = append(merged, tail[i])
			i++
		default:
			merged = append(merged, revEntry{m: ms[j]})
			j++
		}
	}
	l.entries = append(l.entries[:from], merged...)
	for i := from; i < len(l.entries); i++ {
		l.pos[l.entries[i].m.ID] = i
	}
}

// revBefore is the revision order (sortByRev's): by revision, then id.
func revBefore(a, b *Machine) bool { return a.Rev < b.Rev || a.Rev == b.Rev && a.ID < b.ID }

// remove marks the machine's entry dead.
func (l *revlog) remove(id string) {
	if i, ok := l.pos[id]; ok {
		l.entries[i].dead = true
		delete(l.pos, id)
		l.dead++
		if l.dead > 1024 && l.dead > len(l.pos) {
			l.compact()
		}
	}
}

func (l *revlog) compact() {
	live := make([]revEntry, 0, len(l.pos)+len(l.pos)/4)
	for _, e := range l.entries {
		if !e.dead {
			l.pos[e.m.ID] = len(live)
			live = append(live, e)
		}
	}
	l.entries, l.dead = live, 0
}

func (l *revlog) live() int { return len(l.pos) }

// after returns the index of the first entry with a revision above rev.
func (l *revlog) after(rev uint64) int {
	return sort.Search(len(l.entries), func(i int) bool { return l.entries[i].m.Rev > rev })
}

// Walk phases of a List cursor. A cursor-less page that is capped starts
// at a pivot revision p rather than at the oldest machine, so that shards
// picking capacity one machine at a time are handed different machines. A
// walk from a pivot visits, in revision order:
//
//  1. upper: every machine with a revision >= p, up to the newest; when it
//     ends, the newest revision W is remembered;
//  2. lower: every machine with a revision < p;
//  3. delta: every machine with a revision > W, like a delta List.
//
// A machine mutated during the walk moves to a revision above everything
// seen so far, so phase 1 (while it runs) or phase 3 visits it: the walk is
// set-complete under concurrent mutation, as a walk from the oldest machine
// (which is phase 3 alone) always was.
const (
	phaseDelta byte = iota
	phaseUpper
	phaseLower
)

// cursor is a decoded List position: the next machines have revisions
// above pos (phase upper and delta), or between pos and pivot (lower).
type cursor struct {
	phase byte
	pos   uint64
	pivot uint64
	wrap  uint64
}

// walk appends to out up to max machines (0: no cap) that match states,
// starting at c, and returns the cursor that continues after them. newest
// is the newest committed revision.
func (l *revlog) walk(out []*Machine, c cursor, states map[State]bool, max int, newest uint64) ([]*Machine, cursor) {
	full := func() bool { return max > 0 && len(out) >= max }
	take := func(m *Machine) {
		if len(states) == 0 || states[m.State] {
			out = append(out, m)
		}
	}
	if c.phase == phaseUpper {
		i := l.after(c.pos)
		for ; i < len(l.entries) && !full(); i++ {
			if e := l.entries[i]; !e.dead {
				take(e.m)
				c.pos = e.m.Rev
			}
		}
		if !l.exhausted(i) {
			return out, c
		}
		c = cursor{phase: phaseLower, pos: 0, pivot: c.pivot, wrap: newest}
	}
	if c.phase == phaseLower {
		i := l.after(c.pos)
		for ; i < len(l.entries) && l.entries[i].m.Rev < c.pivot && !full(); i++ {
			if e := l.entries[i]; !e.dead {
				take(e.m)
				c.pos = e.m.Rev
			}
		}
		if i < len(l.entries) && l.entries[i].m.Rev < c.pivot && !l.exhaustedBelow(i, c.pivot) {
			return out, c
		}
		c = cursor{phase: phaseDelta, pos: c.wrap}
	}
	i := l.after(c.pos)
	for ; i < len(l.entries) && !full(); i++ {
		if e := l.entries[i]; !e.dead {
			take(e.m)
			c.pos = e.m.Rev
		}
	}
	if l.exhausted(i) {
		c.pos = newest
	}
	return out, c
}

// exhausted reports whether no live entry remains from index i on.
func (l *revlog) exhausted(i int) bool {
	for ; i < len(l.entries); i++ {
		if !l.entries[i].dead {
			return false
		}
	}
	return true
}

// exhaustedBelow reports whether no live entry below pivot remains from
// index i on.
func (l *revlog) exhaustedBelow(i int, pivot uint64) bool {
	for ; i < len(l.entries) && l.entries[i].m.Rev < pivot; i++ {
		if !l.entries[i].dead {
			return false
		}
	}
	return true
}
