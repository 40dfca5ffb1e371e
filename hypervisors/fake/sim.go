package fake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
)

// worldVersion is the version of the saved world file format.
const worldVersion = 1

// sim is the machinery both simulators share: the world lock, call
// counters, hooks, reachability, latency and persistence. The embedding
// simulator's world is guarded by mu.
type sim struct {
	opts Options

	mu          sync.Mutex
	counts      map[string]int
	unreachable map[string]bool
	closed      bool

	hookMu sync.RWMutex
	hook   Hook

	// tasks tracks Proxmox tasks, which outlive the call that started
	// them; Close waits for them.
	tasks sync.WaitGroup
	saver *saver
}

func (s *sim) init(opts Options) {
	s.opts = opts
	s.counts = map[string]int{}
	s.unreachable = map[string]bool{}
	s.hook = opts.Hook
}

func (s *sim) now() time.Time { return s.opts.Clock() }

// enter accounts for one hypervisor call: it counts it, runs the hook,
// fails it if the zone is unreachable or the simulator closed, and waits
// the configured latency.
func (s *sim) enter(ctx context.Context, op, zone string, t hypervisors.Target) error {
	s.mu.Lock()
	s.counts[op]++
	closed, unreachable := s.closed, s.unreachable[zone]
	s.mu.Unlock()
	if closed {
		return fmt.Errorf("%s: fake hypervisor closed: %w", op, hypervisors.ErrUnreachable)
	}
	if h := s.currentHook(); h != nil {
		if err := h(ctx, Call{Op: op, Zone: zone, Target: t}); err != nil {
			return err
		}
	}
	if unreachable {
		return fmt.Errorf("%s: zone %s: connection refused: %w", op, zone, hypervisors.ErrUnreachable)
	}
	return sleep(ctx, s.opts.Latency)
}

// writable fails mutating calls on a read-only simulator.
func (s *sim) writable(op string) error {
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

func (s *sim) zoneHealth(zones []string) map[string]error {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := make(map[string]error, len(zones))
	for _, z := range zones {
		h[z] = nil
		if s.unreachable[z] {
			h[z] = fmt.Errorf("zone %s: connection refused: %w", z, hypervisors.ErrUnreachable)
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

// saver writes the world to a file at most once per debounce interval.
type saver struct {
	path     string
	debounce time.Duration
	// encode marshals the world; it takes the simulator lock itself.
	encode func() ([]byte, error)

	mu      sync.Mutex
	timer   *time.Timer
	lastErr error
	pending sync.WaitGroup // a scheduled or running background save
	// writeMu serialises file writes so an older snapshot never renames
	// over a newer one.
	writeMu sync.Mutex
	// gen counts changes; saved is the gen the file on disk includes
	// (guarded by writeMu).
	gen   atomic.Uint64
	saved uint64
}

// sync writes the world unless the file already includes every change
// made before the call. Concurrent callers share one write, like a group
// commit.
func (p *saver) sync() error {
	want := p.gen.Load()
	p.writeMu.Lock()
	defer p.writeMu.Unlock()
	if p.saved >= want {
		return nil
	}
	return p.writeLocked()
}

// schedule arranges a save after the debounce interval. The caller may
// hold the simulator lock.
func (p *saver) schedule() {
	p.gen.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.timer != nil {
		return
	}
	p.pending.Add(1)
	p.timer = time.AfterFunc(p.debounce, func() {
		defer p.pending.Done()
		p.mu.Lock()
		p.timer = nil
		p.mu.Unlock()
		err := p.flush()
		p.mu.Lock()
		p.lastErr = err
		p.mu.Unlock()
	})
}

// flush writes the current world now.
func (p *saver) flush() error {
	p.writeMu.Lock()
	defer p.writeMu.Unlock()
	return p.writeLocked()
}

func (p *saver) writeLocked() error {
	g := p.gen.Load()
	data, err := p.encode()
	if err != nil {
		return err
	}
	if err := writeFileAtomic(p.path, data); err != nil {
		return err
	}
	p.saved = g
	return nil
}

// Sync makes every change so far durable in the persisted world file (a
// no-op without PersistPath). The provider calls it before it records an
// outcome, so a kill -9 never leaves the state file ahead of the world.
func (s *sim) Sync(context.Context) error {
	if s.saver == nil {
		return nil
	}
	return s.saver.sync()
}

// close cancels a pending save, waits for a running one, writes the world
// and reports the first error of this or an earlier background save.
func (p *saver) close() error {
	p.mu.Lock()
	if p.timer != nil && p.timer.Stop() {
		p.timer = nil
		p.pending.Done()
	}
	p.mu.Unlock()
	p.pending.Wait()
	err := p.flush()
	p.mu.Lock()
	defer p.mu.Unlock()
	return errors.Join(p.lastErr, err)
}

// changed records a mutation of the world. Call it with s.mu held.
func (s *sim) changed() {
	if s.saver != nil && !s.closed {
		s.saver.schedule()
	}
}

func (s *sim) startPersistence(encode func() ([]byte, error)) {
	if s.opts.PersistPath == "" || s.opts.ReadOnly {
		return
	}
	s.saver = &saver{path: s.opts.PersistPath, debounce: s.opts.PersistDebounce, encode: encode}
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
	s.mu.Unlock()
	s.tasks.Wait()
	if s.saver != nil {
		return s.saver.close()
	}
	return nil
}

// writeFileAtomic writes data to path via a temporary file in the same
// directory and a rename, with mode 0600.
func writeFileAtomic(path string, data []byte) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, base+".tmp-*")
	if err != nil {
		return fmt.Errorf("save fake world: %w", err)
	}
	name := tmp.Name()
	fail := func(err error) error {
		tmp.Close()
		os.Remove(name)
		return fmt.Errorf("save fake world %s: %w", path, err)
	}
	if err := tmp.Chmod(0o600); err != nil {
		return fail(err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fail(err)
	}
	if err := tmp.Sync(); err != nil {
		return fail(err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(name)
		return fmt.Errorf("save fake world %s: %w", path, err)
	}
	if err := os.Rename(name, path); err != nil {
		os.Remove(name)
		return fmt.Errorf("save fake world %s: %w", path, err)
	}
	return nil
}

// worldHeader is the part of a world file that says what it holds.
type worldHeader struct {
	Version int               `json:"version"`
	Shape   hypervisors.Shape `json:"shape"`
}

// readWorld reads a world file and checks its version and shape.
func readWorld(path string, shape hypervisors.Shape, into any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("load fake world: %w", err)
	}
	var h worldHeader
	if err := json.Unmarshal(data, &h); err != nil {
		return fmt.Errorf("load fake world %s: %w", path, err)
	}
	if h.Version != worldVersion {
		return fmt.Errorf("load fake world %s: version %d, want %d", path, h.Version, worldVersion)
	}
	if h.Shape != shape {
		return fmt.Errorf("load fake world %s: shape %q, want %q", path, h.Shape, shape)
	}
	if err := json.Unmarshal(data, into); err != nil {
		return fmt.Errorf("load fake world %s: %w", path, err)
	}
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
