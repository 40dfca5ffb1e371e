package desired

import (
	"strconv"
	"strings"
)

// fenceKey names one fence mark: a (shard_id, machine_id) pair. Both are
// arbitrary bytes, so the pair is kept as a struct in memory and stored
// length-prefixed: no choice of bytes makes two pairs share a mark.
type fenceKey struct {
	shard, machine string
}

// mark is the highest (epoch, sequence) accepted for a fence key.
type mark struct {
	Epoch int64 `json:"e"`
	Seq   int64 `json:"s"`
}

// newer reports whether t is strictly newer than m: the lexicographic order
// of (epoch, sequence) as plain int64 pairs, whatever their sign.
func (t Token) newer(m mark) bool {
	return t.Epoch > m.Epoch || t.Epoch == m.Epoch && t.Seq > m.Seq
}

// storeKey is "f/<len(shard)>:<shard><machine>".
func (k fenceKey) storeKey() string {
	return keyFence + strconv.Itoa(len(k.shard)) + ":" + k.shard + k.machine
}

func (k fenceKey) bytes() int { return len(k.shard) + len(k.machine) }

// parseFenceKey is the inverse of storeKey (the part after keyFence).
func parseFenceKey(s string) (fenceKey, bool) {
	n, rest, ok := strings.Cut(s, ":")
	if !ok {
		return fenceKey{}, false
	}
	l, err := strconv.Atoi(n)
	if err != nil || l < 0 || l > len(rest) || strconv.Itoa(l) != n {
		return fenceKey{}, false
	}
	return fenceKey{shard: rest[:l], machine: rest[l:]}, true
}

// parseV1FenceKey reads a format-1 key, "<shard>\x00<machine>", which was
// ambiguous when either id held a NUL: prefer the split whose machine
// exists, else the first NUL.
func parseV1FenceKey(s string, known func(string) bool) (fenceKey, bool) {
	first := -1
	for i := 0; i < len(s); i++ {
		if s[i] != 0 {
			continue
		}
		if first < 0 {
			first = i
		}
		if known(s[i+1:]) {
			return fenceKey{shard: s[:i], machine: s[i+1:]}, true
		}
	}
	if first < 0 {
		return fenceKey{}, false
	}
	return fenceKey{shard: s[:first], machine: s[first+1:]}, true
}

// fences is the working set of fence marks with the accounting that keeps
// it bounded. Callers hold the document's lock.
type fences struct {
	marks      map[fenceKey]mark
	perMachine map[string]int // marks per machine id, known or not
	unknown    int            // marks whose machine does not exist
	bytes      int
}

func newFences() *fences {
	return &fences{marks: map[fenceKey]mark{}, perMachine: map[string]int{}}
}

func (f *fences) add(k fenceKey, m mark, known bool) {
	if _, ok := f.marks[k]; !ok {
		f.perMachine[k.machine]++
		f.bytes += k.bytes()
		if !known {
			f.unknown++
		}
	}
	f.marks[k] = m
}

// admit says whether a first contact for k fits the budgets; the error
// says which one it would break.
func (f *fences) admit(k fenceKey, known bool) *Error {
	switch {
	case known && f.perMachine[k.machine] >= MaxFencesPerMachine:
		return errorf(CodeExhausted, "machine %s already holds fence marks of %d shards, the cap; a new shard's first contact is refused rather than dropping an older mark", k.machine, MaxFencesPerMachine)
	case !known && f.unknown >= MaxUnknownFences:
		return errorf(CodeExhausted, "%d fence marks are kept for machine ids that do not exist, the cap; a new first contact on an unknown id is refused rather than dropping an older mark", MaxUnknownFences)
	case f.bytes+k.bytes() > MaxFenceBytes:
		return errorf(CodeExhausted, "fence marks hold %d bytes of ids, the cap is %d; a new first contact is refused rather than dropping an older mark", f.bytes, MaxFenceBytes)
	}
	return nil
}

// known and forgotten move a machine's marks between the known and the
// unknown budget when the machine appears (adopted) or disappears.
func (f *fences) known(machine string)     { f.unknown -= f.perMachine[machine] }
func (f *fences) forgotten(machine string) { f.unknown += f.perMachine[machine] }
