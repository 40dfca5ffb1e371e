package fake

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
)

// sim is the machinery both simulators share: the world lock, call
// counters, hooks, reachability, latency and persistence. The embedding
// simulator's world is guarded by mu.
type sim struct {
	opts Options
	vms  resolver // the shape's own VMs, for the guest-agent calls

	mu          sync.Mutex
	counts      map[string]int
	unreachable map[string]bool
	flaky       map[string]map[string]bool // zone -> ops that fail transiently
	closed      bool

	hookMu sync.RWMutex
	hook   Hook

	// tasks tracks Proxmox tasks and guest commands that outlive the call
	// that started them; Close waits for them.
	tasks sync.WaitGroup
	// stop is closed by Close to end guest commands still running.
	stop chan struct{}
}

func (s *sim) init(opts Options, vms resolver) {
	s.opts = opts
	s.vms = vms
	s.counts = map[string]int{}
	s.unreachable = map[string]bool{}
	s.flaky = map[string]map[string]bool{}
	s.hook = opts.Hook
	s.stop = make(chan struct{})
}

func (s *sim) now() time.Time { return s.opts.Clock() }

// enter accounts for one hypervisor call: it counts it, runs the hook,
// fails it if the zone is unreachable or the simulator closed, and waits
// the configured latency.
func (s *sim) enter(ctx context.Context, op, zone string, t hypervisors.Target) error {
	return s.enterCall(ctx, Call{Op: op, Zone: zone, Target: t})
}

// enterCall is enter for a call described in full.
func (s *sim) enterCall(ctx context.Context, c Call) error {
	op, zone := c.Op, c.Zone
	s.mu.Lock()
	s.counts[op]++
	closed, unreachable, flaky := s.closed, s.unreachable[zone], s.flaky[zone][op]
	s.mu.Unlock()
	if closed {
		return fmt.Errorf("%s: fake hypervisor closed: %w", op, hypervisors.ErrUnreachable)
	}
	if h := s.currentHook(); h != nil {
		if err := h(ctx, c); err != nil {
			return err
		}
	}
	if unreachable {
		return fmt.Errorf("%s: zone %s: connection refused: %w", op, zone, hypervisors.ErrUnreachable)
	}
	if err := sleep(ctx, s.opts.Latency); err != nil {
		return err
	}
	if flaky {
		return fmt.Errorf("%s: zone %s: the host did not answer in time (simulated flapping host): %w", op, zone, hypervisors.ErrTransient)
	}
	return nil
}

// enterWrite is enter for a call that changes the world: it also fails
// on a read-only simulator.
func (s *sim) enterWrite(ctx context.Context, op, zone string, t hypervisors.Target) error {
	if err := s.enter(ctx, op, zone, t); err != nil {
		return err
	}
	if s.opts.ReadOnly {
		return fmt.Errorf("%s: fake world opened read-only: %w", op, hypervisors.ErrPermission)
	}
	return nil
}

func (s *sim) currentHook() Hook {
	s.hookMu.RLock()
	defer s.hookMu.RUnlock()
	return s.hook
}

// SetHook replaces the per-call hook (nil removes it). Safe to call while
// calls are running.
func (s *sim) setHook(h Hook) {
	s.hookMu.Lock()
	s.hook = h
	s.hookMu.Unlock()
}

func (s *sim) setUnreachable(zone string, on bool) {
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

func (s *sim) setFlaky(zone, op string, on bool) error {
	if !slices.Contains(FlakyOps, op) {
		return fmt.Errorf("unknown call %q; one of %s: %w", op, strings.Join(FlakyOps, ", "), hypervisors.ErrInvalid)
	}
	if !slices.Contains(s.opts.Zones, zone) {
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

// zoneHealth never names the zone: /readyz prints "zone <name>: <health>".
func (s *sim) zoneHealth(zones []string) map[string]error {
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

func (s *sim) calls() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := make(map[string]int, len(s.counts))
	for k, v := range s.counts {
		c[k] = v
	}
	return c
}

func (s *sim) resetCalls() {
	s.mu.Lock()
	s.counts = map[string]int{}
	s.mu.Unlock()
}

// sleep waits d or until ctx is done. A done ctx fails even a zero wait,
// as a real call on a dead context would.
func sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("fake: %w", err)
	}
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("fake: %w", ctx.Err())
	}
}

// persist journals one entity of the world under key: its JSON, or a
// deletion when v is nil. It runs with the world lock held, so the journal
// order is the order of the changes. Call it after every change.
func (s *sim) persist(key string, v any) {
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

// persisted calls f for every entity of the starting world under a key
// prefix (after StatePrefix), in key order.
func (s *sim) persisted(prefix string, f func(key string, raw []byte) error) error {
	keys := make([]string, 0)
	for k := range s.opts.State {
		if strings.HasPrefix(k, StatePrefix+prefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := f(strings.TrimPrefix(k, StatePrefix), s.opts.State[k]); err != nil {
			return fmt.Errorf("load simulated world %s: %w", k, err)
		}
	}
	return nil
}

// close marks the simulator closed, waits for running tasks and flushes
// the world.
func (s *sim) close() error {
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

// mergeZones returns the configured zones in order followed by the zones
// only the loaded world knows, sorted.
func mergeZones(configured []string, loaded []string) []string {
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
