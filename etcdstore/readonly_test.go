package etcdstore

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// ReadOnly reads what the leader committed, in pages, without a term and
// without writing: provider plan's view of an etcd state.
func TestReadOnlyReadsTheCommittedDocument(t *testing.T) {
	c := sharedCluster(t)
	prefix := testPrefix("readonly")
	cl, _, s := leader(t, c, prefix, Options{})
	want := map[string][]byte{}
	var ops []Op
	for i := range 300 {
		k, v := fmt.Sprintf("m/%04d", i), []byte(fmt.Sprintf("value %d", i))
		want[k] = v
		ops = append(ops, Op{Key: k, Value: v})
	}
	if err := commit(t, s, ops...); err != nil {
		t.Fatal(err)
	}
	if err := commit(t, s, Op{Key: "m/0007", Delete: true}); err != nil {
		t.Fatal(err)
	}
	delete(want, "m/0007")
	rev := func() int64 {
		r, err := cl.Get(ctxFor(t), "x")
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}
	before := rev()
	got, err := ReadOnly(ctxFor(t), cl, prefix, 64) // five pages
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("read (-want +got):\n%s", diff)
	}
	if after := rev(); after != before {
		t.Errorf("a read-only load wrote to etcd (revision %d -> %d)", before, after)
	}
	if _, err := ReadOnly(ctxFor(t), cl, "no-slash", 0); err == nil {
		t.Error("a malformed prefix was read")
	}
}
