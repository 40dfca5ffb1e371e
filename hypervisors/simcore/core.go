package simcore

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/retry"
)

// Core is the machinery every simulator shares: the world lock, call
// counters, hooks, reachability, latency, persistence and the VMs' guest
// agents. The simulator that owns a Core keeps its world (hosts, VMs,
// volumes, tasks) guarded by the Core's lock (Lock, Unlock).
type Core struct {
	opts Options
	vms  Machines // the simulator's own VMs, for the guest-agent calls

	mu          sync.Mutex
	counts      map[string]int
	unreachable map[string]bool
	flaky       map[string]map[string]bool // zone -> ops that fail transiently
	closed      bool

	hookMu sync.RWMutex
	hook   Hook

	// tasks tracks work that outlives the call that started it (Proxmox
	// tasks, guest commands); Close waits for it.
	tasks sync.WaitGroup
	// stop is closed by Close to end guest commands still running.
	stop chan struct{}

	// persisted are the starting world's keys (opts.State's under
	// StatePrefix), sorted: found in one pass over a state that is mostly
	// the document's (100,000 machines or more), not one per Persisted.
	persisted     []string
	persistedOnce sync.Once
}

// Machines is how the Core reaches the VMs of the simulator that owns it.
// Both functions run with the world lock held.
type Machines struct {
	// Find returns the machine (power and guest) behind t and its
	// ownership marker (nil: none).
	Find func(t hypervisors.Target) (*Machine, *observed.Marker, error)
	// Save journals the VM behind t after its guest changed.
	Save func(t hypervisors.Target)
}

// New returns the shared core of a simulator over opts (defaults applied
// with Options.WithDefaults) and the simulator's machines.
func New(opts Options, vms Machines) *Core {
	return &Core{
		opts:        opts,
		vms:         vms,
		counts:      map[string]int{},
		unreachable: map[string]bool{},
		flaky:       map[string]map[string]bool{},
		hook:        opts.Hook,
		stop:        make(chan struct{}),
	}
}

// Lock takes the world lock.
func (s *Core) Lock() { s.mu.Lock() }

// Unlock releases the world lock.
func (s *Core) Unlock() { s.mu.Unlock() }

// Now is the simulator's clock (Options.Clock).
func (s *Core) Now() time.Time { return s.opts.Clock() }

// Closed reports whether Close was called; the caller holds the lock.
func (s *Core) Closed() bool { return s.closed }

// Background runs fn on its own goroutine; Close waits for it.
func (s *Core) Background(fn func()) {
	s.tasks.Add(1)
	go func() {
		defer s.tasks.Done()
		fn()
	}()
}

// Enter accounts for one hypervisor call: it counts it, runs the hook,
// fails it if the zone is unreachable or the simulator closed, and waits
// the configured latency.
func (s *Core) Enter(ctx context.Context, op, zone string, t hypervisors.Target) error {
	return s.enterCall(ctx, Call{Op: op, Zone: zone, Target: t})
}

// enterCall is Enter for a call described in full.
func (s *Core) enterCall(ctx context.Context, c Call) error {
	op, zone := c.Op, c.Zone
	s.mu.Lock()
	s.counts[op]++
	closed, unreachable, flaky := s.closed, s.unreachable[zone], s.flaky[zone][op]
	s.mu.Unlock()
	if closed {
		return fmt.Errorf("%s: fake hypervisor closed: %w", op, hypervisors.ErrUnreachable)
	}
	if h := s.CurrentHook(); h != nil {
		if err := h(ctx, c); err != nil {
			return err
		}
	}
	if unreachable {
		return fmt.Errorf("%s: zone %s: connection refused: %w", op, zone, hypervisors.ErrUnreachable)
	}
	if err := Sleep(ctx, s.opts.Latency); err != nil {
		return err
	}
	if flaky {
		return fmt.Errorf("%s: zone %s: the host did not answer in time (simulated flapping host): %w", op, zone, hypervisors.ErrTransient)
	}
	return nil
}

// EnterWrite is Enter for a call that changes the world: it also fails
// on a read-only simulator.
func (s *Core) EnterWrite(ctx context.Context, op, zone string, t hypervisors.Target) error {
	if err := s.Enter(ctx, op, zone, t); err != nil {
		return err
	}
	if s.opts.ReadOnly {
		return fmt.Errorf("%s: fake world opened read-only: %w", op, hypervisors.ErrPermission)
	}
	return nil
}

// CurrentHook is the per-call hook now in place (nil: none).
func (s *Core) CurrentHook() Hook {
	s.hookMu.RLock()
	defer s.hookMu.RUnlock()
	return s.hook
}

// SetHook replaces the per-call hook (nil removes it). Safe to call while
// calls are running.
func (s *Core) SetHook(h Hook) {
	s.hookMu.Lock()
	s.hook = h
	s.hookMu.Unlock()
}

// SetUnreachable makes every call on zone fail with ErrUnreachable (on)
// or restores it.
func (s *Core) SetUnreachable(zone string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if on {
		s.unreachable[zone] = true
	} else {
		delete(s.unreachable, zone)
	}
}

// FlakyOps are the calls SetFlaky can make fail: every call a simulator
// makes on a zone.
var FlakyOps = []string{"Observe", "Lookup", "ReadVolumes", "Start", "Resume", "Stop", "SetAutostart", "SetMarker",
	"DefineDomain", "UndefineDomain", "CreateOverlay", "CreateSeed", "DeleteVolume", "CloneVM", "ConfigureVM", "DeleteVM",
	"AgentPing", "AgentExec", "AgentWriteFile", "AgentRemoveFile"}

// SetFlaky makes every call op (one of FlakyOps) on zone (one of zones)
// fail with ErrTransient after the usual latency (on), as a flapping host
// answers a call it cannot complete with a timeout, or restores it; the
// zone's other calls are unaffected. An unknown op or zone is an
// ErrInvalid error, so the set stays bounded by zones times ops.
func (s *Core) SetFlaky(zones []string, zone, op string, on bool) error {
	if !slices.Contains(FlakyOps, op) {
		return fmt.Errorf("unknown call %q; one of %s: %w", op, strings.Join(FlakyOps, ", "), hypervisors.ErrInvalid)
	}
	if !slices.Contains(zones, zone) {
		return fmt.Errorf("unknown zone %q: %w", zone, hypervisors.ErrInvalid)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case on && s.flaky[zone] == nil:
		s.flaky[zone] = map[string]bool{op: true}
	case on:
		s.flaky[zone][op] = true
	default:
		delete(s.flaky[zone], op)
		if len(s.flaky[zone]) == 0 {
			delete(s.flaky, zone)
		}
	}
	return nil
}

// ZoneHealth is hypervisors.HealthReporter's answer for zones. It never
// names the zone: /readyz prints "zone <name>: <health>".
func (s *Core) ZoneHealth(zones []string) map[string]error {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := make(map[string]error, len(zones))
	for _, z := range zones {
		h[z] = nil
		if s.unreachable[z] {
			h[z] = fmt.Errorf("%w: connection refused", hypervisors.ErrUnreachable)
		}
	}
	return h
}

// Calls returns how many times each operation was called.
func (s *Core) Calls() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := make(map[string]int, len(s.counts))
	for k, v := range s.counts {
		c[k] = v
	}
	return c
}

// ResetCalls zeroes the call counters.
func (s *Core) ResetCalls() {
	s.mu.Lock()
	s.counts = map[string]int{}
	s.mu.Unlock()
}

// Sleep waits d or until ctx is done. A done ctx fails even a zero wait,
// as a real call on a dead context would.
func Sleep(ctx context.Context, d time.Duration) error {
	err := ctx.Err()
	if err == nil && d > 0 {
		err = retry.Sleep(ctx, d)
	}
	if err != nil {
		return fmt.Errorf("fake: %w", err)
	}
	return nil
}

// Persist journals one entity of the world under key: its JSON, or a
// deletion when v is nil. It runs with the world lock held, so the journal
// order is the order of the changes. Call it after every change.
func (s *Core) Persist(key string, v any) {
	if s.opts.Store == nil || s.opts.ReadOnly {
		return
	}
	var raw []byte
	if v != nil && !reflect.ValueOf(v).IsNil() {
		var err error
		if raw, err = json.Marshal(v); err != nil {
			panic(fmt.Sprintf("fake: encode %s: %v", key, err)) // plain data: cannot fail
		}
	}
	s.opts.Store.Journal(StatePrefix+key, raw)
}

// Persisted calls f for every entity of the starting world under a key
// prefix (after StatePrefix), in key order.
func (s *Core) Persisted(prefix string, f func(key string, raw []byte) error) error {
	s.persistedOnce.Do(func() {
		for k := range s.opts.State {
			if strings.HasPrefix(k, StatePrefix) {
				s.persisted = append(s.persisted, k)
			}
		}
		sort.Strings(s.persisted)
	})
	keys := s.persisted
	first, _ := slices.BinarySearch(keys, StatePrefix+prefix)
	for _, k := range keys[first:] {
		if !strings.HasPrefix(k, StatePrefix+prefix) {
			break
		}
		if err := f(strings.TrimPrefix(k, StatePrefix), s.opts.State[k]); err != nil {
			return fmt.Errorf("load simulated world %s: %w", k, err)
		}
	}
	return nil
}

// Close marks the simulator closed and waits for its background work.
// Calls after Close fail with ErrUnreachable.
func (s *Core) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.stop)
	s.mu.Unlock()
	s.tasks.Wait()
	return nil
}

// MergeZones returns the configured zones in order followed by the zones
// only the loaded world knows, sorted.
func MergeZones(configured []string, loaded []string) []string {
	seen := map[string]bool{}
	out := append([]string(nil), configured...)
	for _, z := range configured {
		seen[z] = true
	}
	var extra []string
	for _, z := range loaded {
		if !seen[z] {
			seen[z] = true
			extra = append(extra, z)
		}
	}
	sort.Strings(extra)
	return append(out, extra...)
}
