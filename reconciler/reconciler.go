package reconciler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/util/workqueue"

	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/executor"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/planner"
)

// TypeSpec resolves an instance type for adopting an orphan VM.
type TypeSpec func(instanceType string) (vcpu, memoryMiB int, ok bool)

// Metrics receives the loop's measurements; it may be nil.
type Metrics interface {
	Reconciled(outcome string, d time.Duration)
	// PlanTotals publishes the drift and pending steps the newest plans
	// found; t is never changed afterwards.
	PlanTotals(t *planner.Totals)
	ZoneObserved(zone string, ok bool, at time.Time)
	// RepairFailed counts a drift repair that ran out of attempts or time.
	RepairFailed(zone string)
}

// Options configure a Reconciler.
type Options struct {
	Doc        *desired.Document
	Hypervisor hypervisors.Hypervisor
	Executor   *executor.Executor
	Planner    planner.Config
	Interval   time.Duration // full observe+plan period; 0 = only at start
	Workers    int
	Capacity   string // capacity type of adopted orphans
	Types      TypeSpec
	Logger     *slog.Logger
	Metrics    Metrics
	// ObserveTimeout bounds one zone's listing.
	ObserveTimeout time.Duration
	// QueueMetrics receives the work queue's depth, adds, latencies and
	// retries; nil discards them.
	QueueMetrics workqueue.MetricsProvider
	// RetryMin and RetryMax bound the per-machine backoff of a machine
	// that waits or whose repair failed (defaults 1s and 60s).
	RetryMin, RetryMax time.Duration
	// RepairDelay holds back a drift repair (steps without an intent)
	// until the drift has lasted that long, however it was found (a full
	// pass or an adapter event), so an operator can see it pending in a
	// plan; 0 repairs at once. Intents, failures and adoptions are never
	// delayed. A repair that failed is retried with the queue's backoff,
	// not held again.
	RepairDelay time.Duration
	// RepairTimeout bounds one run of a change without an intent (a drift
	// repair, the clean-up of a FAILED machine); when it passes (or the
	// executor's per-step attempts are spent) the machine goes back to the
	// queue with its per-machine backoff, and RepairFailures reports it.
	// 0: no deadline of its own.
	RepairTimeout time.Duration
	// MinPassGap spaces full passes asked for by Trigger or events
	// (default 500ms), so an event storm costs at most two passes a second.
	MinPassGap time.Duration
	// HostCheck, when set, runs at the end of every full pass (the first
	// is at start) with the machines the pass planned: the server holds
	// the offerings against the hosts' capacity there. It must return
	// within its own bound.
	HostCheck func(ctx context.Context, machines []*desired.Machine)
	// HostFit, when set, holds a Create against its host: it is asked
	// (err nil) before the steps of a Create that makes the machine's VM
	// run, and a non-empty answer fails the machine with it as last_error
	// instead of running them; and it is asked again with the error of a
	// Create whose steps the hypervisor refused for lack of host resources
	// (hypervisors.ErrNoResources), a non-empty answer replacing the raw
	// error in last_error. It must not call the hypervisor.
	HostFit func(m *desired.Machine, err error) string
	Now     func() time.Time
}

// Reconciler is the loop.
type Reconciler struct {
	o Options

	queue workqueue.TypedRateLimitingInterface[string]

	// last is the latest full observation with its index, built once per
	// pass so per-machine work looks things up instead of scanning.
	last atomic.Pointer[lastObservation]
	kick chan struct{}

	// byVM maps "zone\x00vm name" to machine id, rebuilt by every full
	// pass, for events whose adapter does not know the machine.
	byVMMu sync.Mutex
	byVM   map[string]string

	// driftSince is when a machine's pending drift repair was first seen
	// (RepairDelay).
	driftMu    sync.Mutex
	driftSince map[string]time.Time

	// totals keeps the plan totals the metrics publish.
	totals *tally
	// failures are the machines whose newest repair failed.
	failMu   sync.Mutex
	failures map[string]RepairFailure
}

// New returns a Reconciler; call Run to start it.
func New(o Options) *Reconciler {
	if o.Workers <= 0 {
		o.Workers = 32
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.ObserveTimeout <= 0 {
		o.ObserveTimeout = 30 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MinPassGap <= 0 {
		o.MinPassGap = 500 * time.Millisecond
	}
	if o.RetryMin <= 0 {
		o.RetryMin = time.Second
	}
	if o.RetryMax <= 0 {
		o.RetryMax = time.Minute
	}
	cfg := workqueue.TypedRateLimitingQueueConfig[string]{Name: "reconcile", MetricsProvider: o.QueueMetrics}
	limiter := workqueue.NewTypedItemExponentialFailureRateLimiter[string](o.RetryMin, o.RetryMax)
	r := &Reconciler{o: o, queue: workqueue.NewTypedRateLimitingQueueWithConfig(limiter, cfg), kick: make(chan struct{}, 1),
		driftSince: map[string]time.Time{}, failures: map[string]RepairFailure{}}
	var publish func(*planner.Totals)
	if o.Metrics != nil {
		publish = o.Metrics.PlanTotals
	}
	r.totals = newTally(publish, planner.Actions(o.Planner.Plugin), planner.AllDriftKinds(o.Planner.Plugin))
	return r
}

// Enqueue asks for a machine to be reconciled soon. It never blocks.
func (r *Reconciler) Enqueue(id string) { r.queue.Add(id) }

// Depth is the number of machines waiting for a worker.
func (r *Reconciler) Depth() int { return r.queue.Len() }

// Trigger asks for a full observe-and-plan pass now.
func (r *Reconciler) Trigger() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

type lastObservation struct {
	snap *observed.Snapshot
	ix   *observed.Index
}

// Run takes on work until ctx is done, then drains: the machines already
// queued and those being worked on are finished, nothing new is taken on
// (requeues are dropped; their durable intents are re-driven at the next
// start), and Run returns when the workers are idle. Steps run under work,
// which the caller cancels when its shutdown grace runs out.
func (r *Reconciler) Run(ctx, work context.Context) {
	for _, id := range r.o.Doc.Pending() {
		r.Enqueue(id)
	}
	var wg sync.WaitGroup
	for i := 0; i < r.o.Workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.worker(work)
		}()
	}
	if es, ok := hypervisors.Find[hypervisors.EventSource](r.o.Hypervisor); ok {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.consume(ctx, es.Events())
		}()
	}
	defer func() {
		r.queue.ShutDownWithDrain()
		wg.Wait()
	}()
	r.fullPass(work)
	last := time.Now()
	var tick <-chan time.Time
	if r.o.Interval > 0 {
		t := time.NewTicker(r.o.Interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
		case <-r.kick:
			if gap := r.o.MinPassGap - time.Since(last); gap > 0 {
				select {
				case <-ctx.Done():
					continue
				case <-time.After(gap):
				}
			}
		}
		r.fullPass(work)
		last = time.Now()
	}
}

// consume turns adapter events into work until ctx ends or the channel
// closes. Events are hints: each one leads to a fresh look, never to an
// action by itself.
func (r *Reconciler) consume(ctx context.Context, events <-chan hypervisors.Event) {
	for {
		var ev hypervisors.Event
		var ok bool
		select {
		case <-ctx.Done():
			return
		case ev, ok = <-events:
			if !ok {
				return
			}
		}
		switch ev.Kind {
		case hypervisors.EventZoneUp:
			r.o.Logger.Info("zone up: re-driving its pending work", "zone", ev.Zone)
			for _, id := range r.o.Doc.Pending() {
				if m := r.o.Doc.Get(id); m != nil && m.Zone == ev.Zone {
					r.Enqueue(id)
				}
			}
			r.Trigger()
		case hypervisors.EventZoneDown:
			r.Trigger()
		case hypervisors.EventVM:
			id := ev.MachineID
			if id == "" {
				r.byVMMu.Lock()
				id = r.byVM[ev.Zone+"\x00"+ev.VM]
				r.byVMMu.Unlock()
			}
			if id != "" && r.o.Doc.Get(id) != nil {
				r.Enqueue(id)
			}
			r.o.Logger.Debug("vm event", "zone", ev.Zone, "vm", ev.VM, "machine", id, "event", ev.Detail)
			// The full pass publishes the drift and finds VMs no machine
			// claims.
			r.Trigger()
		}
	}
}

func (r *Reconciler) worker(work context.Context) {
	for {
		id, shutdown := r.queue.Get()
		if shutdown {
			return
		}
		r.reconcile(work, id)
		r.queue.Done(id)
	}
}

// ObserveAll lists every zone concurrently; a zone that fails is Unknown.
// It changes no metric (a read such as provider plan calls it).
func (r *Reconciler) ObserveAll(ctx context.Context) *observed.Snapshot {
	return r.observeAll(ctx, false)
}

// observeAll is ObserveAll; record reports each zone's observation to the
// metrics (the loop's own passes).
func (r *Reconciler) observeAll(ctx context.Context, record bool) *observed.Snapshot {
	hv := r.o.Hypervisor
	zones := hv.Zones()
	snap := &observed.Snapshot{Zones: make(map[string]*observed.Zone, len(zones)), At: r.o.Now()}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, z := range zones {
		wg.Add(1)
		go func() {
			defer wg.Done()
			zctx, cancel := context.WithTimeout(ctx, r.o.ObserveTimeout)
			defer cancel()
			at := r.o.Now()
			obs, err := hv.Observe(zctx, z)
			if err != nil {
				obs = observed.Unknown(z, err, at)
			} else {
				obs.At = at
				if r.o.Planner.Plugin.Observation().Volumes {
					obs.VolumesAt = at
				}
			}
			if record && r.o.Metrics != nil {
				r.o.Metrics.ZoneObserved(z, err == nil, at)
			}
			mu.Lock()
			snap.Zones[z] = obs
			mu.Unlock()
		}()
	}
	wg.Wait()
	return snap
}

// Plan observes everything and plans without executing (live `provider
// plan`, /debug/plan). It is a read: it changes no metric and no state.
func (r *Reconciler) Plan(ctx context.Context) *planner.Plan {
	return r.build(r.ObserveAll(ctx), nil)
}

func (r *Reconciler) build(snap *observed.Snapshot, ix *observed.Index) *planner.Plan {
	return planner.Build(planner.Inputs{Config: r.o.Planner, Machines: r.o.Doc.All(), Observed: snap, Index: ix,
		Lineage: r.o.Doc.Lineage(), Serial: r.o.Doc.Revision(), Now: r.o.Now()})
}

// fullPass observes, plans the whole fleet, publishes drift and enqueues
// every machine with something to do.
func (r *Reconciler) fullPass(ctx context.Context) {
	start := time.Now()
	snap := r.observeAll(ctx, true)
	ix := observed.NewIndex(snap, r.o.Planner.Installation)
	r.last.Store(&lastObservation{snap: snap, ix: ix})
	machines := r.o.Doc.All()
	byVM := make(map[string]string, len(machines))
	for _, m := range machines {
		if m.VMName != "" {
			byVM[m.Zone+"\x00"+m.VMName] = m.ID
		}
	}
	r.byVMMu.Lock()
	r.byVM = byVM
	r.byVMMu.Unlock()
	plan := planner.Build(planner.Inputs{Config: r.o.Planner, Machines: machines, Observed: snap, Index: ix,
		Lineage: r.o.Doc.Lineage(), Serial: r.o.Doc.Revision(), Now: r.o.Now()})
	r.totals.full(plan, snap.At)
	r.prune()
	// The histories recorded since the last commit become durable here at
	// the latest: off the RPC path, once per pass.
	if err := r.o.Doc.FlushHistory(ctx); err != nil && ctx.Err() == nil {
		r.o.Logger.Warn("commit histories", "err", err)
	}
	for _, c := range plan.Changes {
		if c.Empty() {
			continue
		}
		if c.Adopt != nil && r.o.Doc.Get(c.Machine) == nil {
			r.Apply(ctx, nil, c)
			continue
		}
		r.Enqueue(c.Machine)
	}
	if r.o.HostCheck != nil {
		r.o.HostCheck(ctx, machines)
	}
	if r.o.Metrics != nil {
		r.o.Metrics.Reconciled("full", time.Since(start))
	}
	r.o.Logger.Debug("full pass", "drift", len(plan.Drift), "changes", len(plan.Changes), "took", time.Since(start).Round(time.Millisecond))
}

func (r *Reconciler) adoptOrphan(ctx context.Context, c planner.Change) {
	a := c.Adopt
	// The listing may predate a Delete that removed this machine: adopt
	// only what a fresh read still shows carrying our marker.
	lctx, cancel := context.WithTimeout(ctx, r.o.ObserveTimeout)
	vm, err := r.o.Hypervisor.Lookup(lctx, hypervisors.Target{Zone: c.Zone, Name: a.VMName, VMID: a.VMID})
	cancel()
	if err != nil || !vm.Owned(r.o.Planner.Installation) || vm.Marker.MachineID != c.Machine || r.o.Doc.Get(c.Machine) != nil {
		return
	}
	vcpu, mem, ok := 0, 0, false
	if r.o.Types != nil {
		vcpu, mem, ok = r.o.Types(a.InstanceType)
	}
	if !ok {
		r.o.Logger.Warn("owned VM has an instance type that is not in the catalog; adopting it without hardware facts", "machine", c.Machine, "vm", a.VMName)
	}
	if _, err := r.o.Doc.Adopt(ctx, desired.Adoption{MachineID: c.Machine, Zone: c.Zone, Host: a.Host, VMName: a.VMName,
		VMID: a.VMID, Cluster: a.Cluster, InstanceType: a.InstanceType, VCPU: vcpu, MemoryMiB: mem, Capacity: r.o.Capacity}); err != nil {
		r.o.Logger.Error("adopt orphan VM", "machine", c.Machine, "err", err)
	}
}

// view builds a fresh observation of just what one machine needs: its VM
// looked up directly, plus its volumes, read directly when the machine's
// plan depends on them and the adapter can (hypervisors.VolumeReader),
// else from the latest full listing.
func (r *Reconciler) view(ctx context.Context, m *desired.Machine) *observed.Snapshot {
	now := r.o.Now()
	last := r.last.Load()
	z := &observed.Zone{Name: m.Zone, Status: observed.StatusOK, At: now}
	snap := &observed.Snapshot{Zones: map[string]*observed.Zone{m.Zone: z}, At: now}
	lctx, cancel := context.WithTimeout(ctx, r.o.ObserveTimeout)
	defer cancel()
	var prev *observed.VM // the owned VM the last full listing showed
	direct := false
	pool, names := r.o.Planner.Plugin.Volumes(m)
	if vr, ok := hypervisors.Find[hypervisors.VolumeReader](r.o.Hypervisor); ok && len(names) > 0 && needsVolumes(m) {
		vols, err := vr.ReadVolumes(lctx, m.Zone, pool, names)
		if err != nil {
			snap.Zones[m.Zone] = observed.Unknown(m.Zone, err, now)
			return snap
		}
		z.Volumes, z.VolumesAt, direct = vols, now, true
	}
	if last != nil {
		if lz := last.snap.Zones[m.Zone]; !direct && lz != nil && !lz.VolumesAt.IsZero() && len(names) > 0 {
			for _, name := range names {
				if v := last.ix.Volume(m.Zone, name); v != nil {
					z.Volumes = append(z.Volumes, v)
				}
			}
			z.VolumesAt = lz.VolumesAt
		}
		prev, _ = last.ix.Owned(m.ID)
	}
	t, ok := r.target(m, prev)
	if !ok {
		return snap
	}
	vm, err := r.o.Hypervisor.Lookup(lctx, t)
	if errors.Is(err, hypervisors.ErrNotFound) && prev != nil && prev.Zone == m.Zone && prev.Name != t.Name {
		// An owned VM under another name (an earlier cycle's, adopted
		// after a crash) is still this machine's.
		vm, err = r.o.Hypervisor.Lookup(lctx, hypervisors.Target{Zone: prev.Zone, Name: prev.Name, VMID: prev.VMID})
	}
	switch {
	case err == nil:
		z.VMs = []*observed.VM{vm}
	case errors.Is(err, hypervisors.ErrNotFound):
	default:
		snap.Zones[m.Zone] = observed.Unknown(m.Zone, err, now)
	}
	return snap
}

// needsVolumes reports whether a machine's plan depends on its volumes: a
// Create builds them, a Delete and the reaping of a FAILED machine remove
// them.
func needsVolumes(m *desired.Machine) bool {
	switch m.State {
	case desired.Creating, desired.Deleting, desired.Failed:
		return true
	}
	return false
}

// target says where a machine's VM is, if anywhere: by its name, or by
// its VMID (recorded, or from the last full listing), as the plug-in's
// Observation says.
func (r *Reconciler) target(m *desired.Machine, prev *observed.VM) (hypervisors.Target, bool) {
	if r.o.Planner.Plugin.Observation().Identity == planner.ByName {
		return hypervisors.Target{Zone: m.Zone, Name: m.VMName}, m.VMName != ""
	}
	if m.VMID != 0 {
		return hypervisors.Target{Zone: m.Zone, Name: m.VMName, VMID: m.VMID}, true
	}
	if prev != nil {
		return hypervisors.Target{Zone: prev.Zone, Name: prev.Name, VMID: prev.VMID}, true
	}
	return hypervisors.Target{}, false
}

// reconcile plans and executes one machine.
func (r *Reconciler) reconcile(ctx context.Context, id string) {
	m := r.o.Doc.Get(id)
	if m == nil {
		r.forget(id)
		return
	}
	start := time.Now()
	wctx, cancel := r.intentContext(ctx, m)
	defer cancel()
	snap := r.view(wctx, m)
	change, drift := planner.Machine(r.o.Planner, m, observed.NewIndex(snap, r.o.Planner.Installation), r.o.Now())
	r.totals.machine(id, snap.At, planner.Of(change, drift))
	if !isRepair(change) {
		r.repaired(id) // nothing (left) to repair
	}
	if wait := r.holdRepair(id, change); wait > 0 {
		r.queue.AddAfter(id, wait)
		return
	}
	if isRepair(change) {
		r.recordDrift(m, change, drift)
	}
	outcome := r.Apply(ctx, m, change)
	switch outcome {
	case OutcomeWait, OutcomeRetry:
		r.queue.AddRateLimited(id)
	default:
		r.queue.Forget(id)
	}
	if outcome == OutcomeOK || outcome == OutcomeAdopted {
		// The steps ran: what is left is the drift no step repairs.
		r.totals.machine(id, r.o.Now(), planner.Reported(drift))
	}
	if r.o.Metrics != nil {
		r.o.Metrics.Reconciled(outcome, time.Since(start))
	}
}

// recordDrift puts the drift a repair is about to act on, and what it
// does about it, in the machine's history.
func (r *Reconciler) recordDrift(m *desired.Machine, c planner.Change, drift []planner.Drift) {
	var kinds, actions []string
	for _, d := range drift {
		k := string(d.Kind)
		if d.Detail != "" {
			k += " (" + d.Detail + ")"
		}
		kinds = append(kinds, k)
	}
	for _, s := range c.Steps {
		actions = append(actions, string(s.Action))
	}
	r.o.Doc.Record(m.ID, desired.Event{Kind: desired.EventDrift, Reason: strings.Join(kinds, "; "),
		Action: "repair: " + strings.Join(actions, ", ")})
}

// holdRepair returns how much longer a drift repair must wait under
// RepairDelay (0: run it now). It remembers when each machine's drift was
// first seen and forgets it once the machine needs no repair or its repair
// succeeded (a failed repair is retried with backoff, not held again); the
// memory holds at most one entry per machine.
func (r *Reconciler) holdRepair(id string, c planner.Change) time.Duration {
	if r.o.RepairDelay <= 0 {
		return 0
	}
	repair := isRepair(c)
	r.driftMu.Lock()
	defer r.driftMu.Unlock()
	if !repair {
		delete(r.driftSince, id)
		return 0
	}
	now := r.o.Now()
	since, ok := r.driftSince[id]
	if !ok {
		r.driftSince[id] = now
		since = now
	}
	if wait := r.o.RepairDelay - now.Sub(since); wait > 0 {
		return wait
	}
	return 0
}

// isRepair reports whether a change is a drift repair: steps without an
// intent, a failure or an adoption.
func isRepair(c planner.Change) bool {
	return c.Intent == nil && c.Fail == "" && c.Adopt == nil && len(c.Steps) > 0
}

// Outcomes of Apply, also the outcome label of the reconcile metrics.
const (
	OutcomeOK          = "ok"
	OutcomeAdopted     = "adopted"
	OutcomeFailed      = "failed"      // the machine went FAILED
	OutcomeWait        = "wait"        // nothing can be done now (unknown host)
	OutcomeRetry       = "retry"       // a drift repair failed; try again later
	OutcomeInterrupted = "interrupted" // ctx ended: re-driven at the next start
	OutcomeError       = "error"       // the outcome could not be recorded
)

// intentContext bounds work on a machine by its transition's deadline,
// or, without a transition, by RepairTimeout.
func (r *Reconciler) intentContext(ctx context.Context, m *desired.Machine) (context.Context, context.CancelFunc) {
	if m.Intent == nil {
		if r.o.RepairTimeout > 0 {
			return context.WithTimeout(ctx, r.o.RepairTimeout)
		}
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, m.Intent.Deadline.Sub(r.o.Now()))
}

// Apply carries out one planned change and records its outcome in the
// desired document: a failure or adoption the plan decided, or the steps
// run under the transition's deadline, then FAILED with last_error on
// error or timeout, or the target state (Settle) on success. m is the
// machine the change was planned from; nil for an orphan VM no machine
// claims. Golden tests drive the same function, so what they pin is what
// the loop does.
func (r *Reconciler) Apply(ctx context.Context, m *desired.Machine, c planner.Change) string {
	if m == nil {
		if c.Adopt == nil {
			return OutcomeOK
		}
		r.adoptOrphan(ctx, c)
		return OutcomeAdopted
	}
	opID := ""
	if m.Intent != nil {
		opID = m.Intent.OpID
	}
	switch {
	case c.Fail != "":
		r.fail(ctx, m, opID, c.Fail)
		return OutcomeFailed
	case c.Adopt != nil:
		a := c.Adopt
		if _, err := r.o.Doc.Adopt(ctx, desired.Adoption{MachineID: m.ID, Zone: m.Zone, Host: a.Host, VMName: a.VMName, VMID: a.VMID, Cluster: a.Cluster}); err != nil {
			r.o.Logger.Error("adopt VM", "machine", m.ID, "err", err)
			return OutcomeError
		}
		return OutcomeAdopted
	case c.Wait != "":
		return OutcomeWait
	case c.Empty():
		return OutcomeOK
	}
	creates := r.o.HostFit != nil && m.Intent != nil && m.Intent.Kind == desired.KindCreate
	if creates && makesVM(c) {
		if short := r.o.HostFit(m, nil); short != "" {
			r.fail(ctx, m, opID, "create failed: "+short)
			return OutcomeFailed
		}
	}
	wctx, cancel := r.intentContext(ctx, m)
	defer cancel()
	res, err := r.o.Executor.Run(wctx, c, opID)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return OutcomeInterrupted // the durable intent is re-driven at restart
		case m.Intent == nil:
			r.repairFailed(m, err)
			return OutcomeRetry
		case creates && errors.Is(err, hypervisors.ErrNoResources):
			why := fmt.Sprintf("create failed: %v", err)
			if short := r.o.HostFit(m, err); short != "" {
				why = "create failed: " + short
			}
			r.fail(ctx, m, opID, why)
		case wctx.Err() != nil:
			r.fail(ctx, m, opID, fmt.Sprintf("%s timed out after %s (at %v)", m.Intent.Kind,
				m.Intent.Deadline.Sub(m.Intent.Started).Round(time.Second), err))
		default:
			r.fail(ctx, m, opID, fmt.Sprintf("%s failed: %v", m.Intent.Kind, err))
		}
		return OutcomeFailed
	}
	if m.Intent == nil {
		r.repaired(m.ID)
	}
	if c.Finish == "" || m.Intent == nil {
		return OutcomeOK
	}
	if _, err := r.o.Doc.Complete(ctx, m.ID, opID, Settle(m, c, res)); err != nil {
		r.o.Logger.Error("record completion", "machine", m.ID, "op", opID, "err", err)
		return OutcomeError
	}
	r.o.Logger.Info("transition done", "machine", m.ID, "op", opID, "state", c.Finish)
	return OutcomeOK
}

// makesVM reports whether a change creates what its machine's VM is made
// of (a plug-in step whose effect is create: libvirt's volumes and
// define, Proxmox's clone): only then does the VM not yet hold its host's
// resources.
func makesVM(c planner.Change) bool {
	for i := range c.Steps {
		if s := &c.Steps[i]; s.Params.Plugin != nil && s.Info().Effect == hypervisors.EffectCreate {
			return true
		}
	}
	return false
}

// Settle says what a change that ran to completion settles its machine
// on: for a Create, the VM the plan worked on (which may be an owned VM
// adopted after a crash) with the VMID a clone step allocated.
func Settle(m *desired.Machine, c planner.Change, out executor.Outcome) desired.Result {
	res := desired.Result{Host: m.Host, VMName: m.VMName, VMID: m.VMID}
	if m.Intent == nil || m.Intent.Kind != desired.KindCreate {
		return res
	}
	if c.VM != nil {
		res.VMName, res.VMID = c.VM.Name, c.VM.VMID
	}
	if out.VMID != 0 {
		res.VMID = out.VMID
	}
	if res.VMID != 0 {
		res.Host = m.Zone + "/" + strconv.Itoa(res.VMID)
	} else {
		res.Host = m.Zone + "/" + res.VMName
	}
	return res
}

func (r *Reconciler) fail(ctx context.Context, m *desired.Machine, opID, reason string) {
	ok, err := r.o.Doc.Fail(ctx, m.ID, opID, reason)
	if err != nil {
		r.o.Logger.Error("record failure", "machine", m.ID, "op", opID, "err", err)
		return
	}
	if ok {
		r.o.Logger.Warn("machine failed", "machine", m.ID, "op", opID, "err", reason)
		r.Enqueue(m.ID) // reap what it left behind
	}
}
