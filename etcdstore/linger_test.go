package etcdstore

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// lingerStore is a leader's store whose committer reports, on lingering,
// to the returned channel.
func lingerStore(t *testing.T, name string, linger time.Duration, onCommit func(ops, bytes int, took time.Duration)) (*Store, chan struct{}) {
	t.Helper()
	c := sharedCluster(t)
	_, _, s := leader(t, c, testPrefix(name), Options{Linger: linger, OnCommit: onCommit})
	lingering := make(chan struct{}, 16)
	s.mu.Lock()
	s.onLinger = func() { lingering <- struct{}{} }
	s.mu.Unlock()
	return s, lingering
}

func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(wait):
		t.Fatalf("%s did not happen within %v", what, wait)
	}
}

// outcomes records done calls in the order they run.
type outcomes struct {
	mu   sync.Mutex
	got  []string
	done chan struct{}
}

func newOutcomes() *outcomes { return &outcomes{done: make(chan struct{}, 16)} }

func (o *outcomes) rec(name string) func(error) {
	return func(err error) {
		o.mu.Lock()
		o.got = append(o.got, fmt.Sprintf("%s:%v", name, err))
		o.mu.Unlock()
		o.done <- struct{}{}
	}
}

// TestLingerSharesTheTxn: a background batch (the reconciler's) is held
// while it is alone, and a Commit arriving meanwhile (an RPC's) ends the
// wait and shares its txn: one txn for both, settled in Commit order.
// Without the linger the background batch goes alone and the Commit waits
// behind it (two txns).
func TestLingerSharesTheTxn(t *testing.T) {
	var mu sync.Mutex
	var txns []int
	s, lingering := lingerStore(t, "linger-share", time.Hour, func(ops, _ int, _ time.Duration) {
		mu.Lock()
		txns = append(txns, ops)
		mu.Unlock()
	})
	o := newOutcomes()
	s.CommitBackground([]Op{{Key: "bg", Value: []byte("complete")}}, o.rec("bg"))
	waitFor(t, lingering, "the committer lingering on a background-only queue")
	s.Commit([]Op{{Key: "rpc", Value: []byte("create")}}, o.rec("rpc"))
	waitFor(t, o.done, "the background batch's done")
	waitFor(t, o.done, "the RPC batch's done")
	o.mu.Lock()
	got := o.got
	o.mu.Unlock()
	if diff := cmp.Diff([]string{"bg:<nil>", "rpc:<nil>"}, got); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff([]int{2}, txns); diff != "" {
		t.Errorf("ops per txn (-want +got):\n%s", diff)
	}
}

// TestLingerBounded: a background batch that no Commit joins is written
// once Linger ends, or sooner once the last txn's duration has (a hold
// never costs more than the txn it saves); Close ends a linger at once; a
// Commit alone never lingers.
func TestLingerBounded(t *testing.T) {
	t.Run("linger-ends", func(t *testing.T) {
		s, lingering := lingerStore(t, "linger-ends", 20*time.Millisecond, nil)
		o := newOutcomes()
		s.CommitBackground([]Op{{Key: "bg", Value: []byte("v")}}, o.rec("bg"))
		waitFor(t, lingering, "lingering")
		waitFor(t, o.done, "the background batch's done once Linger ended")
	})
	t.Run("last-txn-caps", func(t *testing.T) {
		s, lingering := lingerStore(t, "linger-cap", 2*wait, nil) // beyond waitFor: a hold of Linger, not of the last txn, fails it
		o := newOutcomes()
		s.Commit([]Op{{Key: "rpc", Value: []byte("v")}}, o.rec("rpc"))
		waitFor(t, o.done, "the RPC batch's done")
		s.CommitBackground([]Op{{Key: "bg", Value: []byte("v")}}, o.rec("bg"))
		waitFor(t, lingering, "lingering")
		waitFor(t, o.done, "the background batch's done once the last txn's duration ended")
	})
	t.Run("close-ends", func(t *testing.T) {
		s, lingering := lingerStore(t, "linger-close", 2*wait, nil) // beyond waitFor: a linger Close did not end fails it
		o := newOutcomes()
		s.CommitBackground([]Op{{Key: "bg", Value: []byte("v")}}, o.rec("bg"))
		waitFor(t, lingering, "lingering")
		closed := make(chan struct{})
		go func() { s.Close(); close(closed) }()
		waitFor(t, o.done, "the background batch's done after Close")
		waitFor(t, closed, "Close returning")
		if diff := cmp.Diff([]string{"bg:<nil>"}, o.got); diff != "" {
			t.Errorf("outcomes (-want +got):\n%s", diff)
		}
	})
	t.Run("foreground-never-lingers", func(t *testing.T) {
		s, lingering := lingerStore(t, "linger-fg", time.Hour, nil)
		o := newOutcomes()
		s.Commit([]Op{{Key: "rpc", Value: []byte("v")}}, o.rec("rpc"))
		waitFor(t, o.done, "the RPC batch's done")
		select {
		case <-lingering:
			t.Error("the committer lingered on a queue holding a Commit")
		default:
		}
	})
}
