package desired

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/internal/providertest"
)

// completeInFlight starts the completion of machine id's Create on a held
// store (which refuses it when refuse is not nil) and returns once that
// change is in flight: handed to the store, not yet called back. The
// channel gets Complete's error.
func completeInFlight(t *testing.T, d *Document, store *MemoryStore, id string, refuse error) <-chan error {
	t.Helper()
	a, err := mut(t, d, Request{Kind: KindCreate, MachineID: id})
	if err != nil {
		t.Fatal(err)
	}
	store.Hold()
	t.Cleanup(store.Release)
	if refuse != nil {
		store.Fail(refuse)
	}
	done := make(chan error, 1)
	go func() {
		_, err := d.Complete(context.Background(), id, a.OpID, Result{Host: "z1/h1"})
		done <- err
	}()
	for inflight(d, id) == 0 {
		time.Sleep(time.Millisecond)
	}
	if m := d.Get(id); m.State != Creating {
		t.Fatalf("Get shows %v while the completion is in flight, want the committed CREATING", m.State)
	}
	return done
}

// inflight counts the given machines whose change GetFresh would wait
// for: one the store has not called back yet.
func inflight(d *Document, ids ...string) int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	n := 0
	for _, id := range ids {
		if c := d.inflightFor(id); c != nil {
			select {
			case <-c.done:
			default:
				n++
			}
		}
	}
	return n
}

// TestGetFreshWaitsForTheChangeInFlight: while a machine's change is on
// its way to the store, GetFresh waits for it and answers what it
// committed; with nothing in flight it answers at once; and nothing is
// remembered once the store has called back.
func TestGetFreshWaitsForTheChangeInFlight(t *testing.T) {
	store := NewMemoryStore(nil)
	d := open(t, store, slots(2))
	id := "z1/kvm.small/000"
	completed := completeInFlight(t, d, store, id, nil)
	if m := d.GetFresh(providertest.OnWait(context.Background(), store.Release), id); m.State != Idle {
		t.Errorf("GetFresh answered %v, want IDLE, which the change in flight committed", m.State)
	}
	store.Release() // GetFresh did, unless it failed to wait
	if err := <-completed; err != nil {
		t.Fatal(err)
	}
	quiet := providertest.OnWait(context.Background(), func() { t.Error("GetFresh waited with nothing in flight") })
	if m := d.GetFresh(quiet, "z1/kvm.small/001"); m.State != Speculative {
		t.Errorf("untouched machine: %v", m.State)
	}
	if m := d.GetFresh(quiet, "no/such/machine"); m != nil {
		t.Errorf("unknown machine: %+v", m)
	}
	other := "z1/kvm.small/001"
	for _, kind := range []Kind{KindCreate, KindDelete, KindCreate} {
		a, err := mut(t, d, Request{Kind: kind, MachineID: other})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := d.Complete(context.Background(), other, a.OpID, Result{Host: "z1/h1"}); !ok || err != nil {
			t.Fatalf("complete %s: %t %v", kind, ok, err)
		}
	}
	if err := d.Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := inflight(d, id, other); n != 0 {
		t.Errorf("%d machines still recorded in flight after the store called every change back", n)
	}
}

// TestGetFreshNeverShowsWhatIsNotCommitted: a store that does not call
// back costs GetFresh at most FreshWait or its context, and a change the
// store refused is never shown; both answer the committed value.
func TestGetFreshNeverShowsWhatIsNotCommitted(t *testing.T) {
	store := NewMemoryStore(nil)
	d := open(t, store, slots(1))
	id := "z1/kvm.small/000"
	completed := completeInFlight(t, d, store, id, nil)
	if m := d.GetFresh(context.Background(), id); m.State != Creating {
		t.Errorf("stalled store: GetFresh answered %v, want the committed CREATING", m.State)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if m := d.GetFresh(ctx, id); m.State != Creating {
		t.Errorf("ended context: GetFresh answered %v, want the committed CREATING", m.State)
	}

	store.Release()
	if err := <-completed; err != nil {
		t.Fatal(err)
	}
	second := NewMemoryStore(nil)
	d = open(t, second, slots(1))
	failed := completeInFlight(t, d, second, id, errors.New("write state.journal: no space left on device"))
	if m := d.GetFresh(providertest.OnWait(context.Background(), second.Release), id); m.State != Creating {
		t.Errorf("refused change: GetFresh answered %v, want the committed CREATING", m.State)
	}
	second.Release()
	if err := <-failed; err == nil {
		t.Error("Complete on a failed store succeeded")
	}
	if n := inflight(d, id); n != 0 {
		t.Errorf("%d machines still recorded in flight after the store refused their change", n)
	}
}

// stepStore passes commits to a MemoryStore, except while held: then it
// queues them until step passes the oldest on.
type stepStore struct {
	*MemoryStore
	mu     sync.Mutex
	held   bool
	queued []func()
}

func (s *stepStore) Commit(ops []Op, done func(error)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.held {
		s.MemoryStore.Commit(ops, done)
		return
	}
	s.queued = append(s.queued, func() { s.MemoryStore.Commit(ops, done) })
}

func (s *stepStore) hold() {
	s.mu.Lock()
	s.held = true
	s.mu.Unlock()
}

func (s *stepStore) queue() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queued)
}

// step passes the oldest queued commit on.
func (s *stepStore) step() {
	s.mu.Lock()
	next := s.queued[0]
	s.queued = s.queued[1:]
	s.mu.Unlock()
	next()
}

// TestGetFreshWaitsForItsOwnChange: GetFresh waits for the change that
// writes the machine, not for a change to another machine handed to the
// store after it. (It waited for the newest change in flight, which under
// load is a group commit later: the durable walk's ack-to-IDLE paid for
// it.)
func TestGetFreshWaitsForItsOwnChange(t *testing.T) {
	store := &stepStore{MemoryStore: NewMemoryStore(nil)}
	d := open(t, store, slots(2))
	x, y := "z1/kvm.small/000", "z1/kvm.small/001"
	var ops [2]string
	for i, id := range []string{x, y} {
		a, err := mut(t, d, Request{Kind: KindCreate, MachineID: id})
		if err != nil {
			t.Fatal(err)
		}
		ops[i] = a.OpID
	}
	store.hold()
	completed := make(chan error, 2)
	for i, id := range []string{x, y} {
		go func() {
			_, err := d.Complete(context.Background(), id, ops[i], Result{Host: "z1/h1"})
			completed <- err
		}()
		for store.queue() != i+1 {
			time.Sleep(time.Millisecond)
		}
	}
	d.mu.RLock()
	cx, cy, last := d.inflightFor(x), d.inflightFor(y), d.last
	d.mu.RUnlock()
	if cx == nil || cy != last || cx == cy {
		t.Fatalf("x's change is the newest one (%t) or none (%t); want x's own, older than y's", cx == last, cx == nil)
	}
	// Pass x's change on exactly when GetFresh decides to wait; y's stays
	// queued until GetFresh has answered.
	got := make(chan *Machine, 1)
	go func() { got <- d.GetFresh(providertest.OnWait(context.Background(), store.step), x) }()
	select {
	case m := <-got:
		if m.State != Idle {
			t.Errorf("GetFresh answered %v, want IDLE, which x's change committed", m.State)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("GetFresh did not answer in 10s")
	}
	store.step()
	for range 2 {
		if err := <-completed; err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}
	d.mu.RLock()
	n := len(d.pending)
	d.mu.RUnlock()
	if n != 0 {
		t.Errorf("%d machines still recorded in flight after the store called every change back", n)
	}
}
