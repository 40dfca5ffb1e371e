package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/bigfleet-vm/provider/capacity"
	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/executor"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/jsonplan"
	"github.com/bigfleet-vm/provider/metrics"
	"github.com/bigfleet-vm/provider/planner"
	"github.com/bigfleet-vm/provider/reconciler"
	"github.com/bigfleet-vm/provider/statefile"
)

// term is one tenure of the desired state on this replica: the store it
// writes, the document, the hypervisor adapter and the loop acting on
// them. A single replica (local journal or memory) has one term for its
// whole life; with an etcd state a term lasts while this replica leads,
// and the next one is built afresh from what etcd holds.
type term struct {
	store   stateStore
	doc     *desired.Document
	raw, hv hypervisors.Hypervisor // raw: before instrumentation (admin endpoints)
	rec     *reconciler.Reconciler
	planner planner.Config
	log     *slog.Logger
	// metrics are this term's series, exported while it is served.
	metrics *metrics.Term
	// guard, when set, says whether the leadership term still holds (an
	// etcd Term's Err, which checks the lease deadline on every call).
	guard func() error

	stopLoop, cancelWork context.CancelFunc
	loopDone             chan struct{}

	// latest is each zone's newest capacity reading (nil under
	// --capacity-check=off); canReadCapacity whether the adapter reads it.
	latest          *capacity.Latest
	canReadCapacity bool
	types           capacity.TypeSpec
	maxRatio        float64

	// laps is how long each part of opening the term took (logged when
	// it starts serving: what a takeover spends, part by part).
	laps laps
}

// laps times consecutive parts of a piece of work.
type laps struct {
	last  time.Time
	parts []string
}

// lap ends the part named name (begun at the previous lap, or at the
// first call's time when there is none).
func (l *laps) lap(name string) {
	now := time.Now()
	if !l.last.IsZero() {
		l.parts = append(l.parts, name+"="+now.Sub(l.last).Round(100*time.Microsecond).String())
	}
	l.last = now
}

// String is the parts in order, "name=duration" each.
func (l *laps) String() string { return strings.Join(l.parts, " ") }

// capacitySection is the live plan's capacity section, from the newest
// readings of the full passes (no hypervisor call of its own); nil under
// --capacity-check=off.
func (t *term) capacitySection() *jsonplan.Capacity {
	if t.latest == nil {
		return nil
	}
	return capacitySection(t.hv.Zones(), t.canReadCapacity, t.latest, t.doc.All(), t.types, t.maxRatio)
}

// openTerm loads the document from store (recovering interrupted work as
// after a restart), opens the hypervisor (the simulator's world from the
// same store) and assembles executor and reconciler. Nothing runs yet. On
// error store is closed.
//
// guard, when set, is asked before every hypervisor step and before every
// answer served from the document (an etcd leadership term's Err).
// warm, when set, is a warm standby's copy the store's load may hand
// over (desired.Options.Warm).
func openTerm(ctx context.Context, cfg *config.Config, log *slog.Logger, m *metrics.Metrics, store stateStore, guard func() error, warm *standbyCopy) (_ *term, err error) {
	t := &term{store: store, log: log, guard: guard}
	t.laps.lap("")
	defer func() {
		if err != nil {
			store.Close()
		}
	}()
	// The document and the simulator's world come from one read of the
	// store (a 100,000-machine etcd state takes a while to read).
	once := &loadOnce{stateStore: store, laps: &t.laps}
	opts := docOptions(cfg, once)
	var slots []desired.Slot
	if warm != nil {
		slots, opts.Warm = warm.slots, warm.take
	} else {
		slots = desiredSlots(cfg)
	}
	opts.Notify = func(id string) {
		if t.rec != nil {
			t.rec.Enqueue(id)
		}
	}
	doc, rep, err := desired.Open(ctx, opts, slots)
	if err != nil {
		return nil, err
	}
	t.doc = doc
	t.laps.lap("document")
	log.Info("state loaded", "machines", doc.Len(), "added", rep.Added, "removed", rep.Removed, "slotless", rep.Slotless,
		"redriven", rep.Redriven, "installation", doc.Installation())
	if rep.Lost != "" {
		log.Error("the state lost acknowledged records in a recovery: every fence epoch accepted before is refused from now on (shards continue with a new epoch), operation ids continue above every one issued, and List cursors from before are void", "report", rep.Lost)
	}

	world := simWorld{}
	if cfg.StatePath != "" {
		world = simWorld{state: once.loaded, store: store}
	}
	t.raw, err = openHypervisor(ctx, cfg, doc.Installation(), log, world)
	if err != nil {
		return nil, err
	}
	t.hv = metrics.Instrument(t.raw, m)
	t.laps.lap("hypervisor")
	t.planner = plannerConfig(cfg, doc.Installation())
	exec := executor.New(executor.Options{Hypervisor: t.hv, Identity: t.planner.Plugin.Observation().Identity, Installation: doc.Installation(), Blob: doc.Blob,
		PerZone: cfg.MaxConcurrentPerZone, Logger: log, Observer: m,
		// A guest command's start is committed before it is sent (for the
		// record; the guest's own record of it decides what a re-driven
		// transition does).
		ExecStarting: doc.ExecStarting, Guard: guard, RepairAttempts: cfg.RepairAttempts,
		// Steps and guest commands go to the machine's history; they ride
		// along with the next commit.
		Record: doc.Record})
	capType := desired.OnDemand
	if cfg.BareMetal {
		capType = desired.BareMetal
	}
	t.metrics = m.NewTerm(guard)
	types := catalogSpec(cfg)
	var (
		check func(context.Context, []*desired.Machine)
		fit   func(*desired.Machine, error) string
	)
	t.types, t.maxRatio = types, cfg.CapacityOvercommit
	if cfg.CapacityCheck != config.CapacityOff {
		// The newest reading of each zone: the plan's capacity section and
		// every Create's check read it, the full pass writes it.
		t.latest = &capacity.Latest{}
		_, t.canReadCapacity = hypervisors.Find[hypervisors.CapacityReader](t.hv)
	}
	t.laps.lap("executor")
	switch cfg.CapacityCheck {
	case config.CapacityRefuse:
		if err := refuseOver(ctx, t.hv, t.latest, doc.All(), types, cfg.CapacityOvercommit, log); err != nil {
			_ = t.hv.Close()
			return nil, err
		}
		fallthrough
	case config.CapacityWarn:
		// What the zones' machines hold, from the start (a Create before
		// the first pass is held against the stored machines too).
		l := newLedger(types)
		l.start(doc.Select(holdsHost))
		check = hostCheck(t.hv, t.latest, l, types, cfg.CapacityOvercommit, capacityReadTimeout, t.metrics, log)
		fit = hostFit(t.latest, l, types, cfg.CapacityOvercommit, cfg.CapacityCheck == config.CapacityRefuse)
	}
	t.laps.lap("capacity")
	t.rec = reconciler.New(reconciler.Options{Doc: doc, Hypervisor: t.hv, Executor: exec, Planner: t.planner,
		Interval: cfg.ReconcileInterval, Capacity: capType, Logger: log, Metrics: t.metrics, QueueMetrics: m.QueueMetrics(),
		RepairDelay: cfg.DriftRepairDelay, RepairTimeout: cfg.RepairTimeout, Types: reconciler.TypeSpec(types), HostCheck: check, HostFit: fit})
	return t, nil
}

// start runs the reconcile loop.
func (t *term) start() {
	loopCtx, stopLoop := context.WithCancel(context.Background())
	workCtx, cancelWork := context.WithCancel(context.Background())
	t.stopLoop, t.cancelWork, t.loopDone = stopLoop, cancelWork, make(chan struct{})
	go func() {
		t.rec.Run(loopCtx, workCtx)
		close(t.loopDone)
	}()
}

// drain is a graceful stop: mutations are refused (UNAVAILABLE), the
// queued and in-flight work finishes within grace, and then whatever is
// left is interrupted (its durable intent is re-driven by the next term).
func (t *term) drain(grace time.Duration, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	t.doc.Refuse(why)
	defer t.flushHistory()
	if t.loopDone == nil {
		return
	}
	// A mutation accepted just before the refusal reaches the queue only
	// once its commit settles; the queue stops taking work after that.
	if err := t.doc.Quiesce(ctx); err != nil {
		t.log.Warn("changes accepted before the stop did not settle within the grace; they are re-driven at the next start", "err", err)
	}
	t.log.Info("finishing queued and in-flight work", "grace", grace, "queued", t.rec.Depth())
	t.stopLoop()
	select {
	case <-t.loopDone:
	case <-ctx.Done():
		t.log.Warn("queued and in-flight work did not finish within the shutdown grace; it is interrupted now and re-driven at the next start")
	}
	t.cancelWork()
	<-t.loopDone
}

// flushHistory commits what the last steps recorded in the machines'
// histories (it rides along with no later commit), so a clean stop loses
// none of it. Bounded; abort (a replica that may no longer write) does not
// call it.
func (t *term) flushHistory() {
	ctx, cancel := context.WithTimeout(context.Background(), historyFlushTimeout)
	defer cancel()
	if err := t.doc.FlushHistory(ctx); err != nil {
		t.log.Warn("commit histories at shutdown", "err", err)
	}
}

// historyFlushTimeout bounds the commit of the histories at a graceful
// stop.
const historyFlushTimeout = 5 * time.Second

// abort stops at once: a replica that lost its leadership must not act a
// moment longer. In-flight steps are cancelled; their intents are the next
// leader's to re-drive.
func (t *term) abort(why string) {
	t.doc.Refuse(why)
	if t.loopDone == nil {
		return
	}
	t.stopLoop()
	t.cancelWork()
	<-t.loopDone
}

// close releases the hypervisor and flushes the store.
func (t *term) close() error {
	var errs []error
	if t.raw != nil {
		errs = append(errs, t.hv.Close())
	}
	if err := t.store.Close(); err != nil && !errors.Is(err, desired.ErrStoreClosed) {
		errs = append(errs, fmt.Errorf("close state store: %w", err))
	}
	return errors.Join(errs...)
}

// lost returns a channel that yields the store's failure once the store
// stops because its files were removed under it (statefile.ErrLost); it
// never yields for other stores or other failures.
func (t *term) lost() <-chan error {
	ch := make(chan error, 1)
	j, ok := t.store.(journaled)
	if !ok {
		return ch
	}
	f, ok := j.backend.(*statefile.File)
	if !ok {
		return ch
	}
	go func() {
		<-f.Stopped()
		if err := f.Healthy(); errors.Is(err, statefile.ErrLost) {
			ch <- err
		}
	}()
	return ch
}

// standbyCopy is how a term takes a warm standby's copy of the document:
// the offerings the copy was indexed against (this process's, computed
// once) and what hands the copy over once the store's load took it.
type standbyCopy struct {
	slots []desired.Slot
	take  func() *desired.Warm
}

// loadOnce remembers what the document loaded, so the simulator's world
// (its sim/ keys, which the document never writes) is read from the same
// cut without a second read of the store.
type loadOnce struct {
	stateStore
	loaded map[string][]byte
	laps   *laps
}

func (l *loadOnce) Load(ctx context.Context) (map[string][]byte, error) {
	m, err := l.stateStore.Load(ctx)
	l.loaded = m
	l.laps.lap("load")
	return m, err
}
