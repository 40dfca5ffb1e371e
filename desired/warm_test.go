package desired

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/bigfleet-vm/provider/naming"
)

// How warmFrom puts a cut's records into a copy.
type arrival int

const (
	inOrder    arrival = iota // in revision order, each settled on its own (a watch)
	loadOrder                 // in no order, settled once (a load)
	outOfOrder                // in no order, each settled on its own: the copy re-sorts
)

// warmFrom builds a warm copy of stored classified against s.
func warmFrom(t *testing.T, stored map[string][]byte, s []Slot, how arrival) *Warm {
	t.Helper()
	w := NewWarm(s)
	keys := make([]string, 0, len(stored))
	for k := range stored {
		keys = append(keys, k)
	}
	rev := func(k string) uint64 {
		if m, err := prepare(k, stored[k]); err == nil {
			return m.Rev
		}
		return 0
	}
	slices.SortFunc(keys, func(a, b string) int { return int(rev(a)) - int(rev(b)) })
	if how != inOrder {
		r := rand.New(rand.NewPCG(1, 2))
		r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	}
	for _, k := range keys {
		w.Put(k, stored[k])
		if how != loadOrder {
			w.Settle()
		}
	}
	w.Settle()
	return w
}

// opened is what an Open left behind, for comparing two of them.
type opened struct {
	Err      string
	Report   LoadReport
	Machines []Machine
	List     []string
	Rev      uint64
	Stored   map[string]string
}

func openFor(t *testing.T, stored map[string][]byte, s []Slot, w *Warm) opened {
	t.Helper()
	store := NewMemoryStore(stored)
	opts := Options{Store: store, DefaultInstallation: "inst", DeleteSupported: true,
		Now: func() time.Time { return t0.Add(time.Hour) }, VMName: naming.VMName}
	taken := false
	if w != nil {
		opts.Warm = func() *Warm { taken = true; return w }
	}
	d, rep, err := Open(context.Background(), opts, s)
	if w != nil && !taken {
		t.Fatal("Open never asked for the warm copy")
	}
	if err != nil {
		return opened{Err: err.Error()}
	}
	o := opened{Report: rep, Rev: d.Revision(), Stored: map[string]string{}}
	for _, m := range d.All() {
		o.Machines = append(o.Machines, *m)
	}
	ms, _ := d.List(nil, 0, nil)
	for _, m := range ms {
		o.List = append(o.List, fmt.Sprintf("%s@%d", m.ID, m.Rev))
	}
	// Events that ride along with later commits are written now.
	if err := d.FlushHistory(context.Background()); err != nil {
		t.Fatal(err)
	}
	after, err := store.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range after {
		if k != keyMeta { // its lineage is random on a fresh document only; compared below
			o.Stored[k] = string(v)
		}
	}
	return o
}

// A term opened from a warm copy is the term a full load opens, whatever
// the document holds and however the offerings changed: the same
// machines, revisions, List order, report and first commit (or the same
// error). Built in revision order or not, and kept current through puts
// and deletes after it was built.
func TestOpenFromWarmMatchesLoad(t *testing.T) {
	// Machines 0-23: CREATING (i%3 == 0, below 20), CONFIGURING (i%3 ==
	// 1), DELETING (i%3 == 2) and, from 20, IDLE (20, 22, 23) or CREATING
	// (21); 24-39 SPECULATIVE. Between the early cut and the stored one
	// the deletes are asked for and machine 38 is written again (its
	// price changed) and then leaves (an Open on offerings without it),
	// so a copy built early and kept current sees a record deleted, within
	// a cut it was put in.
	base := slots(40)
	d := open(t, NewMemoryStore(nil), base)
	ctx := context.Background()
	id := func(i int) string { return base[i].ID }
	for i := range 24 {
		a, err := mut(t, d, Request{Kind: KindCreate, MachineID: id(i)})
		if err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 { // stays CREATING: re-driven at the next open
			continue
		}
		if _, err := d.Complete(ctx, id(i), a.OpID, Result{Host: "h"}); err != nil {
			t.Fatal(err)
		}
		if i%3 == 1 && i < 20 {
			if _, err := mut(t, d, Request{Kind: KindConfigure, MachineID: id(i), Cluster: "c", Blob: []byte("b")}); err != nil {
				t.Fatal(err)
			}
		}
	}
	early, err := d.opts.Store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{Store: NewMemoryStore(early)}
	pricier := slices.Clone(base)
	pricier[38].Price = 2
	open(t, rec, pricier) // machine 38 written again, to be deleted next
	d = open(t, rec, slices.Delete(slices.Clone(base), 38, 39))
	for i := 2; i < 20; i += 3 {
		if _, err := mut(t, d, Request{Kind: KindDelete, MachineID: id(i)}); err != nil {
			t.Fatal(err)
		}
	}
	cut := func() (map[string][]byte, [][]Op) {
		if err := d.FlushHistory(ctx); err != nil {
			t.Fatal(err)
		}
		m, err := rec.Load(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return m, slices.Clone(rec.ops)
	}
	mid, midOps := cut()
	if _, ok := mid[keyMachine+id(38)]; ok {
		t.Fatal("machine 38 is still stored")
	}
	d = open(t, rec, base) // 38 comes back
	final, finalOps := cut()
	// A header behind its machines (a crash between the parts of a split
	// commit): the document's revision is its newest machine's.
	var hm meta
	if err := json.Unmarshal(final[keyMeta], &hm); err != nil {
		t.Fatal(err)
	}
	hm.Rev = 1
	behind := maps.Clone(final)
	if behind[keyMeta], err = json.Marshal(hm); err != nil {
		t.Fatal(err)
	}

	changed := func(f func([]Slot) []Slot) []Slot { return f(slices.Clone(base)) }
	offerings := map[string][]Slot{
		"same": base,
		"price and labels of a few": changed(func(s []Slot) []Slot {
			s[4].Price, s[25].Labels = 1, map[string]string{"new": "label"}
			return s
		}),
		"more slots":                    append(slices.Clone(base), slots(45)[40:]...),
		"three speculative ones go":     changed(func(s []Slot) []Slot { return slices.Delete(s, 30, 31)[:37] }),
		"fewer, one creating, one idle": changed(func(s []Slot) []Slot { return slices.Delete(slices.Delete(s, 23, 24), 3, 4) }),
		"an idle machine moves zone": changed(func(s []Slot) []Slot {
			s[22].Zone = "z2"
			return s
		}),
		"a speculative machine moves type": changed(func(s []Slot) []Slot {
			s[33].InstanceType = "kvm.large"
			return s
		}),
	}
	for name, s := range offerings {
		for _, c := range []struct {
			name   string
			stored map[string][]byte
			since  [][]Op // the changes from early to stored, commit by commit
		}{{"without 38", mid, midOps}, {"38 back", final, finalOps}, {"header behind", behind, finalOps}} {
			t.Run(name+"/"+c.name, func(t *testing.T) {
				want := openFor(t, c.stored, s, nil)
				for _, how := range []arrival{inOrder, loadOrder, outOfOrder} {
					if diff := cmp.Diff(want, openFor(t, c.stored, s, warmFrom(t, c.stored, s, how)), cmpopts.IgnoreUnexported(Machine{})); diff != "" {
						t.Errorf("arrival %d: a warm open differs from a full load (-load +warm):\n%s", how, diff)
					}
				}
				// Built from the early cut and kept current by every
				// change since, as a follower's watch delivers them: one
				// commit per response, or several (a key put and then
				// deleted within one).
				for _, every := range []int{1, 5, len(c.since)} {
					w := warmFrom(t, early, s, loadOrder)
					for i, batch := range c.since {
						for _, op := range batch {
							if op.Delete {
								w.Delete(op.Key)
							} else {
								w.Put(op.Key, op.Value)
							}
						}
						if (i+1)%every == 0 {
							w.Settle()
						}
					}
					// Its index is the one a copy built from the cut has.
					fresh := warmFrom(t, c.stored, s, loadOrder)
					w.Settle()
					if w.withSlot != fresh.withSlot || !maps.Equal(w.pick, fresh.pick) {
						t.Errorf("kept current, %d commits a cut: %d machines with a slot, picked %v; built from the cut: %d, %v", every,
							w.withSlot, slices.Sorted(maps.Keys(w.pick)), fresh.withSlot, slices.Sorted(maps.Keys(fresh.pick)))
					}
					if diff := cmp.Diff(want, openFor(t, c.stored, s, w), cmpopts.IgnoreUnexported(Machine{})); diff != "" {
						t.Errorf("kept current, %d commits a cut: a warm open differs from a full load (-load +warm):\n%s", every, diff)
					}
				}
			})
		}
	}
}

// recorder is a store that keeps every commit made to it, in order.
type recorder struct {
	Store
	mu  sync.Mutex
	ops [][]Op
}

func (r *recorder) Commit(ops []Op, done func(error)) {
	r.mu.Lock()
	r.ops = append(r.ops, slices.Clone(ops))
	r.mu.Unlock()
	r.Store.Commit(ops, done)
}

// partsOf returns the machine records of a fleet's first write (n slots),
// in revision order, with the other stored keys.
func partsOf(t testing.TB, n int) (machines []string, stored map[string][]byte) {
	t.Helper()
	s := slots(n)
	stored, err := open(t, NewMemoryStore(nil), s).opts.Store.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rev := map[string]uint64{}
	for k, v := range stored {
		if m, err := prepare(k, v); err == nil {
			machines, rev[k] = append(machines, k), m.Rev
		}
	}
	slices.SortFunc(machines, func(a, b string) int { return int(rev[a]) - int(rev[b]) })
	if len(machines) != n {
		t.Fatalf("the first write stored %d machines of %d", len(machines), n)
	}
	return machines, stored
}

// A standby follows the first write of a fleet as the store writes it: in
// parts written in parallel, which its watch delivers in any order. A
// part older than one settled before is merged in near the end of the
// order, with allocations in proportion to the part: the copy used to
// rebuild its whole order for each such part (at 100,000 machines, 181
// times in one benchmark's first write, about 40 ms of CPU each).
func TestWarmLatePartCostsThePart(t *testing.T) {
	const n, part = 20000, 127
	keys, stored := partsOf(t, n)
	s := slots(n)
	w := NewWarm(s)
	settle := func(ks []string) (allocated uint64) {
		for _, k := range ks {
			w.Put(k, stored[k])
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		w.Settle()
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}
	settle(keys[:n-2*part])
	settle(keys[n-part:]) // the newer part first
	if got := settle(keys[n-2*part : n-part]); got > 64<<10 {
		t.Errorf("settling a part of %d machines older than the newest part allocated %d bytes: the order of all %d was rebuilt", part, got, n)
	}
	// And the order is the one a load builds.
	want := warmFrom(t, stored, s, loadOrder)
	if diff := cmp.Diff(liveOrder(want.log), liveOrder(w.log)); diff != "" {
		t.Errorf("order after a late part (-load +parts):\n%s", diff)
	}
}

// liveOrder lists a revlog's live machines in its order, checking its
// positions index them.
func liveOrder(l *revlog) []string {
	var out []string
	for i, e := range l.entries {
		if e.dead {
			continue
		}
		out = append(out, fmt.Sprintf("%s@%d", e.m.ID, e.m.Rev))
		if l.pos[e.m.ID] != i {
			out = append(out, fmt.Sprintf("(pos %d, at %d)", l.pos[e.m.ID], i))
		}
	}
	if len(l.pos) != len(out) {
		out = append(out, fmt.Sprintf("(%d positions)", len(l.pos)))
	}
	return out
}

// insert keeps a revlog in revision order, whatever the cuts' order, with
// machines written again and removed between them.
func TestRevlogInsertKeepsRevisionOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for round := range 200 {
		l := newRevlog(0)
		live := map[string]*Machine{}
		var rev uint64
		for range 1 + r.IntN(30) {
			// A cut: some machines (new, or written again), with revisions
			// either after every one so far or within the last ones.
			var cut []*Machine
			for range 1 + r.IntN(8) {
				id := fmt.Sprintf("m%02d", r.IntN(40))
				if slices.ContainsFunc(cut, func(m *Machine) bool { return m.ID == id }) {
					continue
				}
				rev++
				cut = append(cut, &Machine{ID: id, Rev: rev})
			}
			if r.IntN(3) == 0 && rev > 20 {
				for _, m := range cut {
					m.Rev -= 20 // as a part written in parallel, older than the last
				}
			}
			sortByRev(cut)
			late := false
			for _, m := range cut {
				if old := live[m.ID]; old != nil && old.Rev > m.Rev {
					late = true // its newer value is settled: not a valid cut
				}
			}
			if late {
				continue
			}
			for _, m := range cut {
				l.remove(m.ID)
				live[m.ID] = m
			}
			l.insert(cut)
			if r.IntN(4) == 0 {
				id := fmt.Sprintf("m%02d", r.IntN(40))
				l.remove(id)
				delete(live, id)
			}
		}
		want := slices.Collect(maps.Values(live))
		sortByRev(want)
		var wantOrder []string
		for _, m := range want {
			wantOrder = append(wantOrder, fmt.Sprintf("%s@%d", m.ID, m.Rev))
		}
		if diff := cmp.Diff(wantOrder, liveOrder(l)); diff != "" {
			t.Fatalf("round %d: order (-sorted +revlog):\n%s", round, diff)
		}
	}
}

// BenchmarkWarmFollowFleetWrite follows the first write of a 100,000-
// machine fleet as a standby's watch delivers it: parts of 127 machines
// (etcd's 128 ops a txn, less the writer key), four in flight at a time
// (etcdstore.DefaultChunkParallel), each group of four arriving in a
// random order. One op is the whole write.
func BenchmarkWarmFollowFleetWrite(b *testing.B) {
	const n, part, inFlight = 100000, 127, 4
	keys, stored := partsOf(b, n)
	s := slots(n)
	var parts [][]string
	for i := 0; i < n; i += part {
		parts = append(parts, keys[i:min(i+part, n)])
	}
	r := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < len(parts); i += inFlight {
		g := parts[i:min(i+inFlight, len(parts))]
		r.Shuffle(len(g), func(a, c int) { g[a], g[c] = g[c], g[a] })
	}
	b.ResetTimer()
	for range b.N {
		w := NewWarm(s)
		for _, p := range parts {
			for _, k := range p {
				w.Put(k, stored[k])
			}
			w.Settle()
		}
	}
}
