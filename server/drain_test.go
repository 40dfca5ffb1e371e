package server

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/metrics"
)

// heldStore holds the commits made while armed until release is closed,
// the way a slow disk or an etcd round trip leaves a change accepted but
// not yet settled.
type heldStore struct {
	*desired.MemoryStore
	armed   atomic.Bool
	held    chan struct{} // receives once per held commit
	release chan struct{}
}

func (s *heldStore) Commit(ops []desired.Op, done func(error)) {
	if !s.armed.Load() || done == nil {
		s.MemoryStore.Commit(ops, done)
		return
	}
	s.held <- struct{}{}
	s.MemoryStore.Commit(ops, func(err error) {
		<-s.release
		done(err)
	})
}

// TestGracefulStopWorksOnAMutationAcceptedBeforeIt is the regression of
// a Drain accepted just before SIGTERM that the stop dropped: its commit
// settled after the reconciler's queue had shut down, so the machine was
// handed to a closed queue and left DRAINING until the next start
// (TestContract/*/GracefulStopFinishesQueuedWork failed so under load).
// The stop now waits for the changes accepted before it to settle.
func TestGracefulStopWorksOnAMutationAcceptedBeforeIt(t *testing.T) {
	cfg, err := config.Parse(testReg, []string{"--use-fake-backend", "--seed-count", "2", "--metrics-addr", ""}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	store := &heldStore{MemoryStore: desired.NewMemoryStore(nil), held: make(chan struct{}, 1), release: make(chan struct{})}
	tm, err := openTerm(ctx, cfg, slog.New(slog.DiscardHandler), metrics.New(nil, nil), journaled{store}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tm.close()
	tm.start()
	all := tm.doc.All()
	if len(all) != 2 {
		t.Fatalf("%d machines, want 2", len(all))
	}
	id := all[0].ID

	store.armed.Store(true)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := tm.doc.Mutate(ctx, desired.Request{Kind: desired.KindCreate, MachineID: id}); err != nil {
			t.Errorf("create accepted before the stop: %v", err)
		}
	}()
	<-store.held // accepted, not yet settled
	store.armed.Store(false)

	stopped := make(chan struct{})
	go func() {
		tm.drain(time.Minute, "the provider is shutting down")
		close(stopped)
	}()
	// Once mutations are refused the stop is under way; only then does
	// the accepted Create settle. (A probe accepted earlier would wait
	// behind the held commit, so each probe gives up at once.)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Millisecond)
		_, err := tm.doc.Mutate(pctx, desired.Request{Kind: desired.KindConfigure, MachineID: "no/such/machine"})
		cancel()
		if err != nil && strings.Contains(err.Error(), "mutations are refused") {
			break
		}
	}
	close(store.release)
	<-stopped
	if m := tm.doc.Get(id); m == nil || m.State != desired.Idle {
		t.Errorf("the Create accepted before the stop ended %v, want IDLE (worked on, not left for the next start)", m)
	}
}
