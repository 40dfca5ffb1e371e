package simtest

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/guest"
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
	"github.com/bigfleet-vm/provider/observed"
)

// observeAll observes every zone of h.
func observeAll(t *testing.T, h hypervisors.Hypervisor) map[string]*observed.Zone {
	t.Helper()
	out := map[string]*observed.Zone{}
	for _, z := range h.Zones() {
		o, err := h.Observe(context.Background(), z)
		if err != nil {
			t.Fatal(err)
		}
		out[z] = o
	}
	return out
}

func testPersistence(t *testing.T, s Shape) {
	secret := []byte("very-secret-join-token")
	t.Run("journal-reload", func(t *testing.T) {
		ctx := context.Background()
		mem := newJournal()
		b := buildRunning(t, s, simcore.Options{Store: mem}, "c-1")
		if err := b.h.AgentWriteFile(ctx, b.t, b.blobPath, secret, 0o600); err != nil {
			t.Fatal(err)
		}
		if r, err := b.h.AgentExec(ctx, b.t, b.bootstrap); err != nil || r.ExitCode != 0 {
			t.Fatalf("bootstrap: %+v, %v", r, err)
		}
		if err := b.h.Stop(ctx, b.t, 0); err != nil {
			t.Fatal(err)
		}
		state := mem.Snapshot()
		for k, v := range state {
			if !strings.HasPrefix(k, simcore.StatePrefix) {
				t.Errorf("key %q outside %s", k, simcore.StatePrefix)
			}
			if bytes.Contains(v, secret) {
				t.Errorf("journaled %s contains the blob", k)
			}
		}
		h2 := s.open(t, simcore.Options{State: state})
		if d := cmp.Diff(observeAll(t, b.h), observeAll(t, h2), IgnoreAt); d != "" {
			t.Errorf("reloaded world (-want +got)\n%s", d)
		}
		// The guest kept its history (without the blob): once running
		// again it is still a bootstrapped node.
		if err := h2.Start(ctx, b.t); err != nil {
			t.Fatal(err)
		}
		r, err := h2.AgentExec(ctx, b.t, []string{simcore.DefaultReadyCommand})
		if err != nil || r.ExitCode != 0 {
			t.Errorf("ready after reload: %+v, %v", r, err)
		}
		// Records under another simulator's keys are not this one's:
		// it ignores them, even when it could not read them.
		foreign := maps.Clone(state)
		foreign[simcore.StatePrefix+"zz/vm/1"] = []byte("not this simulator's record")
		if d := cmp.Diff(observeAll(t, b.h), observeAll(t, s.open(t, simcore.Options{State: foreign})), IgnoreAt); d != "" {
			t.Errorf("world reloaded beside a foreign record (-want +got)\n%s", d)
		}
	})

	// A guest command runs at most once, also when the process that ran
	// the simulator dies: whatever tail of the journal a crash loses, a
	// world that shows a command's effect also shows the wrapper's record
	// that it started and how it ends, so a new simulator re-driving the
	// same operation reports it instead of running it again (a drain ran
	// twice in the fail-over suite when a crash fell between two records
	// of one request).
	t.Run("a-crash-never-runs-a-command-twice", func(t *testing.T) {
		ctx := context.Background()
		for _, c := range []struct {
			name string
			op   func(b built) guest.Op
			ran  func(g simcore.GuestState) int
		}{
			{"drain", func(built) guest.Op {
				return guest.Op{Key: "op-1-drain", Argv: []string{simcore.DefaultDrainCommand}, Rerun: true}
			}, func(g simcore.GuestState) int { return len(g.DrainKeys) }},
			{"bootstrap", func(b built) guest.Op {
				return guest.Op{Key: "op-1-bootstrap", Argv: b.bootstrap,
					Stage: &guest.Stage{Target: b.blobPath, Data: secret, Have: true}}
			}, func(g simcore.GuestState) int { return len(g.Bootstraps) }},
		} {
			t.Run(c.name, func(t *testing.T) {
				mem := newJournal()
				b := buildRunning(t, s, simcore.Options{Store: mem}, "c-1")
				from := mem.Len()
				op := c.op(b)
				if out, err := guest.Run(ctx, guest.VM{Hypervisor: b.h, Target: b.t}, op); err != nil || out.ExitCode != 0 {
					t.Fatalf("%s: %+v, %v", c.name, out, err)
				}
				to := mem.Len()
				if to == from {
					t.Fatalf("the %s journaled nothing", c.name)
				}
				for n := from; n <= to; n++ {
					h := s.open(t, simcore.Options{State: mem.Prefix(n)})
					if out, err := guest.Run(ctx, guest.VM{Hypervisor: h, Target: b.t}, op); err != nil || out.ExitCode != 0 {
						t.Fatalf("after a crash behind record %d of %d: the %s re-driven: %+v, %v", n-from, to-from, c.name, out, err)
					}
					if g, _ := h.Guest(b.t); c.ran(g) != 1 {
						t.Errorf("after a crash behind record %d of %d the %s ran %d times, want once", n-from, to-from, c.name, c.ran(g))
					}
				}
			})
		}
	})

	t.Run("removal-is-journaled", func(t *testing.T) {
		mem := newJournal()
		h := s.open(t, simcore.Options{Store: mem})
		target := s.Place(t, h, "bf-a", Marker("m-1", ""))
		if err := h.RemoveVM(target); err != nil {
			t.Fatal(err)
		}
		h2 := s.open(t, simcore.Options{State: mem.Snapshot()})
		if _, err := h2.Lookup(context.Background(), target); !errors.Is(err, hypervisors.ErrNotFound) {
			t.Errorf("removed VM came back: %v", err)
		}
	})

	t.Run("read-only", func(t *testing.T) {
		ctx := context.Background()
		mem := newJournal()
		h := s.open(t, simcore.Options{Store: mem})
		target := s.Place(t, h, "bf-a", Marker("m-1", ""))
		before := mem.Snapshot()
		ro := s.open(t, simcore.Options{State: before, Store: mem, ReadOnly: true})
		if z := observeAll(t, ro); len(z[target.Zone].VMs) == 0 {
			t.Error("read-only world observed empty")
		}
		ErrIs(t, "stop", ro.Stop(ctx, target, 0), hypervisors.ErrPermission)
		ErrIs(t, "marker", ro.SetMarker(ctx, target, Marker("m-1", "")), hypervisors.ErrPermission)
		if d := cmp.Diff(before, mem.Snapshot()); d != "" {
			t.Errorf("read-only simulator journaled changes (-before +after)\n%s", d)
		}
	})
}

// journal is a Store that keeps every record in the order it was
// journaled.
type journal struct {
	mu  sync.Mutex
	log []journaled
}

type journaled struct {
	key   string
	value []byte
}

func newJournal() *journal { return &journal{} }

func (j *journal) Journal(key string, value []byte) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.log = append(j.log, journaled{key, bytes.Clone(value)})
}

// Snapshot is the world as journaled so far.
func (j *journal) Snapshot() map[string][]byte { return j.Prefix(j.Len()) }

// Len is how many records were journaled so far.
func (j *journal) Len() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.log)
}

// Prefix is the world as a crash would leave it after the first n
// records: a store makes one Journal call durable whole or not at all,
// and in order, but may lose any tail of them.
func (j *journal) Prefix(n int) map[string][]byte {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := map[string][]byte{}
	for _, r := range j.log[:n] {
		if r.value == nil {
			delete(out, r.key)
		} else {
			out[r.key] = r.value
		}
	}
	return out
}
