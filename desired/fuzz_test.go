package desired

import (
	"context"
	"testing"
)

// A List cursor is client input: any bytes give an answer without
// panicking, and bytes this document did not produce are no cursor (the
// full list).
func FuzzListCursor(f *testing.F) {
	d := open(f, NewMemoryStore(nil), slots(20))
	for i := 0; i < 5; i++ {
		mut(f, d, Request{Kind: KindCreate, MachineID: slots(20)[i*3].ID})
	}
	_, c1 := d.List(nil, 3, nil)
	_, c2 := d.List(nil, 0, nil)
	f.Add(c1)
	f.Add(c2)
	f.Add([]byte("bf\x02garbage"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, raw []byte) {
		ms, next := d.List(nil, 4, raw)
		if len(ms) > 4 || len(next) == 0 {
			t.Fatalf("%d machines, cursor %q", len(ms), next)
		}
		if _, ok := d.decodeCursor(raw, d.Revision()); !ok {
			if all, _ := d.List(nil, 0, raw); len(all) != 20 {
				t.Fatalf("an unreadable cursor gave %d machines, want the full 20", len(all))
			}
		}
	})
}

// Any request either is accepted or rejected with one of the documented
// codes, and a rejected one changes no machine.
func FuzzMutate(f *testing.F) {
	f.Add(uint8(0), "z1/kvm.small/000", "s", int64(1), int64(1), "c", []byte("blob"), "k", "v", int64(30))
	f.Add(uint8(1), "z1/kvm.small/001", "", int64(0), int64(0), "\xff", []byte{}, "\x00", "", int64(-1))
	f.Add(uint8(2), "nope", "s\x00", int64(-9), int64(9), "", []byte(nil), "", "", int64(9223372036854775807))
	f.Fuzz(func(t *testing.T, kind uint8, id, shard string, epoch, seq int64, cluster string, blob []byte, mk, mv string, grace int64) {
		d := open(t, NewMemoryStore(nil), slots(3))
		for _, s := range slots(3)[:2] {
			a, _ := mut(t, d, Request{Kind: KindCreate, MachineID: s.ID})
			d.Complete(context.Background(), s.ID, a.OpID, Result{Host: "h"})
		}
		kinds := []Kind{KindCreate, KindConfigure, KindDrain, KindDelete}
		r := Request{Kind: kinds[int(kind)%len(kinds)], MachineID: id, Token: Token{shard, epoch, seq}, Cluster: cluster,
			Blob: blob, Metadata: map[string]string{mk: mv}, Grace: grace}
		before := d.Get(id)
		ack, err := mut(t, d, r)
		switch code(err) {
		case 0:
			if ack.OpID == "" || ack.Machine == nil {
				t.Fatalf("accepted without an op id: %+v", ack)
			}
		case CodeInvalid, CodeFenced, CodeNotFound, CodeConflict, CodeExhausted:
			if after := d.Get(id); after != before {
				t.Fatalf("rejected %v (%v) changed the machine", r.Kind, err)
			}
			if len(err.Error()) > 4096 {
				t.Fatalf("a %d-byte error echoes the input", len(err.Error()))
			}
		default:
			t.Fatalf("undocumented outcome %v", err)
		}
	})
}
