package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/bigfleet-vm/provider/internal/etcdtest"
)

// startFollower runs a follower of prefix on cl until the test ends.
func startFollower(t *testing.T, cl *clientv3.Client, prefix string) *Follower {
	t.Helper()
	f, err := NewFollower(cl, prefix, FollowOptions{LoadPageSize: 7, Retry: 200 * time.Millisecond,
		Index: func() Index { return &mapIndex{m: map[string]any{}} }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

// mapIndex is an index of "decoded:"+value for every key outside skip/;
// settled counts the cuts it was told of.
type mapIndex struct {
	m       map[string]any
	settled int
}

func (x *mapIndex) Put(k string, v []byte) {
	if !strings.HasPrefix(k, "skip/") {
		x.m[k] = "decoded:" + string(v)
	}
}
func (x *mapIndex) Delete(k string) { delete(x.m, k) }
func (x *mapIndex) Settle()         { x.settled++ }

// writerRev is the revision of the last txn a store under prefix wrote.
func writerRev(t *testing.T, cl *clientv3.Client, prefix string) int64 {
	t.Helper()
	resp, err := cl.Get(ctxFor(t), prefix+"/writer")
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("read %s/writer: %v (%d keys)", prefix, err, len(resp.Kvs))
	}
	return resp.Kvs[0].ModRevision
}

// headRev is the cluster's revision now (a linearizable read).
func headRev(t *testing.T, cl *clientv3.Client) int64 {
	t.Helper()
	resp, err := cl.Get(ctxFor(t), "/no-such-key")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// waitFollower waits until ok holds for the follower's status.
func waitFollower(t *testing.T, f *Follower, what string, ok func(Status) bool) Status {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		st := f.Status()
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("follower: %s did not happen within %v (status %+v)", what, wait, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// take takes the follower's copy once it is current at the cluster's
// revision now.
func take(t *testing.T, f *Follower, cl *clientv3.Client, prefix string) map[string]string {
	t.Helper()
	// A write under the prefix, outside the document: its event vouches
	// for the copy as a leader's claim does.
	put, err := cl.Put(ctxFor(t), prefix+"/probe", "x")
	if err != nil {
		t.Fatal(err)
	}
	rev := put.Header.Revision
	ctx, cancel := context.WithTimeout(ctxFor(t), wait)
	defer cancel()
	c, err := f.Take(ctx, rev)
	if err != nil {
		t.Fatal(err)
	}
	if c.Revision < rev {
		t.Fatalf("Take returned a copy at revision %d, below the %d asked for", c.Revision, rev)
	}
	return strMap(c.Values)
}

// The follower loads once and then applies the watch: puts, overwrites,
// deletes and oversized (chunked) batches committed after its load are in
// its copy, without a second load, and its copy holds only the current
// values (bytes equal to the document's, not to what was written).
func TestFollowerAppliesEvents(t *testing.T) {
	c := sharedCluster(t)
	prefix := testPrefix("follow")
	cl, _, s := leader(t, c, prefix, Options{MaxTxnOps: 8})
	var md model
	commitModel := func(ops ...Op) {
		t.Helper()
		if err := commit(t, s, ops...); err != nil {
			t.Fatal(err)
		}
		md.apply(ops)
	}
	for i := range 20 {
		commitModel(Op{Key: fmt.Sprintf("m/%02d", i), Value: value(i, 40)})
	}
	f := startFollower(t, newClient(t, c), prefix)
	waitFollower(t, f, "the first load", func(st Status) bool { return st.Loads == 1 && st.HasCurrent })
	for round := range 30 {
		commitModel(Op{Key: fmt.Sprintf("m/%02d", round%20), Value: value(round, 100+round)})
		commitModel(Op{Key: fmt.Sprintf("m/%02d", (round+7)%20), Delete: true})
	}
	var big []Op
	for i := range 30 { // more than MaxTxnOps: chunked txns
		big = append(big, Op{Key: fmt.Sprintf("big/%02d", i), Value: value(i, 10)})
	}
	commitModel(big...)
	commitModel(Op{Key: "skip/1", Value: []byte("x")}, Op{Key: "skip/2", Value: []byte("y")})
	commitModel(Op{Key: "skip/1", Delete: true})
	rev := writerRev(t, cl, prefix) // the last txn: its event moves the copy
	st := waitFollower(t, f, "catching up", func(st Status) bool { return st.Revision >= rev })
	if st.Loads != 1 {
		t.Errorf("the follower loaded %d times; the watch should have carried every change after the first load", st.Loads)
	}
	if st.Bytes != md.bytes() || st.Keys != len(md.snapshot()) {
		t.Errorf("the copy holds %d keys and %d bytes, the document %d and %d", st.Keys, st.Bytes, len(md.snapshot()), md.bytes())
	}
	cp, err := f.Take(ctxFor(t), rev)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(md.snapshot(), strMap(cp.Values)); diff != "" {
		t.Errorf("copy differs from the committed document (-want +got):\n%s", diff)
	}
	wantDecoded := map[string]any{}
	for k, v := range md.snapshot() {
		if !strings.HasPrefix(k, "skip/") {
			wantDecoded[k] = "decoded:" + v
		}
	}
	idx := cp.Index.(*mapIndex)
	if diff := cmp.Diff(wantDecoded, idx.m); diff != "" {
		t.Errorf("the index differs from the copy's values (-want +got):\n%s", diff)
	}
	if idx.settled < 2 {
		t.Errorf("the index was told of %d cuts, want its load and the watch responses since", idx.settled)
	}
	if st := f.Status(); st.HasCurrent || st.Revision != 0 {
		t.Errorf("after Take the follower still holds a copy: %+v", st)
	}
}

// Take returns once an event at the revision asked for (or later) has
// reached the copy. A write under the prefix outside the document (the
// writer key: a new leader's claim) counts; writes elsewhere do not, and
// neither does a progress report, even one asked for (etcd before 3.4.25
// and 3.5.8 may send one ahead of events it has still to send: etcd issue
// 15220). It fails with ErrNotCurrent, not hangs, when no event comes.
func TestFollowerTakeNeedsAnEvent(t *testing.T) {
	c := sharedCluster(t)
	prefix := testPrefix("follow-event")
	cl, _, s := leader(t, c, prefix, Options{})
	if err := commit(t, s, Op{Key: "a", Value: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	fcl := newClient(t, c)
	f := startFollower(t, fcl, prefix)
	waitFollower(t, f, "the first load", func(st Status) bool { return st.HasCurrent })
	for i := range 5 { // beside the prefix: no event reaches the follower
		if _, err := cl.Put(ctxFor(t), fmt.Sprintf("%s-elsewhere/%d", prefix, i), "x"); err != nil {
			t.Fatal(err)
		}
	}
	rev := headRev(t, cl)
	if err := fcl.RequestProgress(followStream(ctxFor(t))); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctxFor(t), 500*time.Millisecond)
	_, err := f.Take(ctx, rev)
	cancel()
	if !errors.Is(err, ErrNotCurrent) {
		t.Fatalf("Take of a revision only other keys and a progress report reached: %v, want ErrNotCurrent", err)
	}
	put, err := cl.Put(ctxFor(t), prefix+"/writer", "claim")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(ctxFor(t), wait)
	cp, err := f.Take(ctx, put.Header.Revision)
	cancel()
	if err != nil {
		t.Fatalf("Take of the writer key's revision: %v", err)
	}
	if diff := cmp.Diff(map[string]string{"a": "1"}, strMap(cp.Values)); diff != "" {
		t.Errorf("copy (-want +got): keys outside the document are not in it:\n%s", diff)
	}
}

// A follower whose watch was broken while etcd compacted past its
// revision (a partition, then a compaction, then the network back) is
// told so when the watch resumes, and loads the state again: its copy is
// the document, with the changes made meanwhile.
func TestFollowerReloadsAfterCompaction(t *testing.T) {
	c := sharedCluster(t)
	prefix := testPrefix("follow-compact")
	cl, _, s := leader(t, c, prefix, Options{})
	var md model
	commitModel := func(ops ...Op) {
		t.Helper()
		if err := commit(t, s, ops...); err != nil {
			t.Fatal(err)
		}
		md.apply(ops)
	}
	commitModel(Op{Key: "a", Value: []byte("1")}, Op{Key: "b", Value: []byte("2")})
	proxy := etcdtest.NewProxy(t, c.Endpoints()[0])
	fcl, err := NewClient(context.Background(), ClientConfig{Endpoints: []string{proxy.Addr}, KeepAliveTime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fcl.Close() })
	f := startFollower(t, fcl, prefix)
	waitFollower(t, f, "the first load", func(st Status) bool { return st.Loads == 1 && st.HasCurrent })
	before := f.Status().Revision

	proxy.Blackhole()
	commitModel(Op{Key: "a", Delete: true}, Op{Key: "c", Value: []byte("3")})
	commitModel(Op{Key: "b", Value: []byte("22")})
	rev := headRev(t, cl)
	if _, err := cl.Compact(ctxFor(t), rev); err != nil {
		t.Fatal(err)
	}
	if got := f.Status().Revision; got != before {
		t.Fatalf("the blackholed follower moved from revision %d to %d", before, got)
	}
	proxy.Heal()
	st := waitFollower(t, f, "a reload after the compaction", func(st Status) bool { return st.Loads >= 2 && st.Revision >= rev })
	t.Logf("after the compaction: %+v", st)
	if diff := cmp.Diff(md.snapshot(), take(t, f, cl, prefix)); diff != "" {
		t.Errorf("copy differs from the committed document (-want +got):\n%s", diff)
	}
}

// etcd cancels the watch of a follower whose member lost its leader (the
// follower requires one); the follower loads again once there is a
// leader, and its copy holds what was committed after the cancel.
func TestFollowerReloadsAfterCancel(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	prefix := "/follow-cancel"
	cl := c.Client(t)
	put := func(k, v string) {
		t.Helper()
		if _, err := cl.Put(ctxFor(t), prefix+"/state/"+k, v); err != nil {
			t.Fatal(err)
		}
	}
	put("a", "1")
	fcl, err := NewClient(context.Background(), ClientConfig{Endpoints: []string{c.Endpoints()[2]}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fcl.Close() })
	f := startFollower(t, fcl, prefix)
	waitFollower(t, f, "the first load", func(st Status) bool { return st.Loads == 1 && st.HasCurrent })

	c.Kill(t, 0)
	c.Kill(t, 1)
	st := waitFollower(t, f, "the watch cancelled for want of a leader", func(st Status) bool { return st.Err != nil })
	if !strings.Contains(st.Err.Error(), "no leader") {
		t.Errorf("the watch ended with %v, want etcd's no-leader cancel", st.Err)
	}
	c.Restart(t, 0)
	c.Restart(t, 1)
	c.WaitLeader(t)
	put("b", "2")
	put("a", "11")
	st = waitFollower(t, f, "a reload after the cancel", func(st Status) bool { return st.Loads >= 2 && st.Err == nil })
	t.Logf("after the cancel: %+v", st)
	if diff := cmp.Diff(map[string]string{"a": "11", "b": "2"}, take(t, f, cl, prefix)); diff != "" {
		t.Errorf("copy (-want +got):\n%s", diff)
	}
}

// A new leader's Load takes the standby's copy once it is current at the
// revision Open read (so it holds every write of the term before, up to
// its last), and loads from etcd when the copy cannot get there in time
// (here: the standby's network is cut while the old leader writes).
func TestStoreLoadTakesWarmCopy(t *testing.T) {
	c := sharedCluster(t)
	for _, cut := range []bool{false, true} {
		t.Run(fmt.Sprintf("cut=%t", cut), func(t *testing.T) {
			prefix := testPrefix("warm-load")
			cl, termA, a := leader(t, c, prefix, Options{})
			var md model
			commitModel := func(ops ...Op) {
				t.Helper()
				if err := commit(t, a, ops...); err != nil {
					t.Fatal(err)
				}
				md.apply(ops)
			}
			commitModel(Op{Key: "a", Value: []byte("1")}, Op{Key: "b", Value: []byte("2")})
			proxy := etcdtest.NewProxy(t, c.Endpoints()[1])
			fcl, err := NewClient(context.Background(), ClientConfig{Endpoints: []string{proxy.Addr}, KeepAliveTime: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { fcl.Close() })
			f := startFollower(t, fcl, prefix)
			waitFollower(t, f, "the first load", func(st Status) bool { return st.HasCurrent })
			if cut {
				proxy.Blackhole()
			}
			// The old leader's last writes, right before it goes.
			for i := range 10 {
				commitModel(Op{Key: fmt.Sprintf("late/%d", i), Value: value(i, 20)}, Op{Key: "a", Value: value(i, 5)})
			}
			commitModel(Op{Key: "b", Delete: true})
			a.Close()
			if err := termA.Resign(ctxFor(t)); err != nil {
				t.Fatal(err)
			}
			termB := lead(t, newElector(t, newClient(t, c), prefix, "replica-b", 0))
			// Another user of the cluster writes: its revisions reach no
			// follower of this prefix, so only the new leader's claim of
			// the writer key can vouch for the copy.
			if _, err := cl.Put(ctxFor(t), prefix+"-elsewhere", "x"); err != nil {
				t.Fatal(err)
			}
			warm := false
			b := openStore(t, cl, prefix, termB, Options{WarmWait: 300 * time.Millisecond,
				Warm: func(ctx context.Context, rev int64) (Copy, error) {
					c, err := f.Take(ctx, rev)
					warm = err == nil
					t.Logf("Take(%d): at %d, %v", rev, c.Revision, err)
					return c, err
				}})
			m, err := b.Load(ctxFor(t))
			if err != nil {
				t.Fatal(err)
			}
			if warm == cut {
				t.Errorf("the warm copy was used: %t; want %t", warm, !cut)
			}
			if diff := cmp.Diff(md.snapshot(), strMap(m)); diff != "" {
				t.Errorf("the new leader's document differs from the old leader's last (-want +got):\n%s", diff)
			}
			if b.Size() != md.bytes() {
				t.Errorf("Size %d, want %d", b.Size(), md.bytes())
			}
		})
	}
}
