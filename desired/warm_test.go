package desired

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
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
