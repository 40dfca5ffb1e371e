package executor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/guest"
	"github.com/bigfleet-vm/provider/planner"
	"github.com/bigfleet-vm/provider/retry"
)

// maxExcerpt bounds hook output copied into last_error.
const maxExcerpt = 512

// DefaultBlobGrace is Options.BlobGrace's default.
const DefaultBlobGrace = 30 * time.Second

// removeTimeout bounds removing the blob after the hook, which runs even
// when the step's context is done.
const removeTimeout = 30 * time.Second

// Observer receives step outcomes (metrics); it may be nil.
type Observer interface {
	StepDone(zone, action, outcome string, d time.Duration)
}

// Options configure an Executor.
type Options struct {
	Hypervisor hypervisors.Hypervisor
	// Identity is how the hypervisor names a VM (the plug-in's
	// Observation): by ID, a step's target is not known before the step
	// that allocates its VMID has run.
	Identity     planner.Identity
	Installation string
	// Blob returns the in-memory bootstrap blob of a Configure.
	Blob func(machineID, opID string) ([]byte, bool)
	// PerZone bounds concurrent host-loading steps per zone.
	PerZone  int
	Logger   *slog.Logger
	Observer Observer
	// MinBackoff and MaxBackoff are the first and the largest wait between
	// attempts of a step (retry.Step: 100ms and 2s, jittered).
	MinBackoff, MaxBackoff time.Duration
	// ExecStarting, when set, is called once per Run of a bootstrap or
	// drain step, right before its wrapper is first sent to the guest. If
	// it returns an error, nothing is sent and the step fails with that
	// error. The caller may record durably that the command may have
	// started; what decides whether it runs, though, is the record the
	// guest keeps of it (package guest): a re-driven operation finds its
	// command finished, running or never started there. Readiness probes
	// do not call it.
	ExecStarting func(ctx context.Context, machineID, opID, stepID string) error
	// BlobGrace is how long a Configure whose blob is neither in memory
	// nor staged in the guest (the replica that accepted it died first)
	// waits for a retry of the Configure to bring it back, before it fails
	// with BlobNeverDelivered (default 30s).
	BlobGrace time.Duration
	// Guard, when set, is asked right before every attempt that touches
	// a hypervisor or a guest (a step's first attempt and each retry,
	// guest writes, commands, probes and the blob's removal included); a
	// non-nil answer stops the step at once, never retried (a replica that
	// lost its leadership must not act, even before its timers have told
	// it). It is called from several goroutines at once.
	Guard func() error
	// RepairAttempts caps the attempts of each step of a change that
	// carries no operation (opID "": a drift repair, or the clean-up of a
	// FAILED machine); 0 retries them until ctx ends. Steps of an
	// operation are bounded by its deadline only.
	RepairAttempts int
	// Record, when set, receives every step applied and every guest
	// command's exit status for the machine's history (desired.Record).
	// It must not block.
	Record func(machineID string, ev desired.Event)
}

// ErrorClass names the class of err (hypervisors' error classes) for the
// history: "" for nil.
func ErrorClass(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, hypervisors.ErrOutcomeUnknown):
		return "outcome-unknown"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	}
	for _, c := range []struct {
		err  error
		name string
	}{
		{hypervisors.ErrNotFound, "not-found"}, {hypervisors.ErrExists, "exists"}, {hypervisors.ErrLocked, "locked"},
		{hypervisors.ErrTransient, "transient"}, {hypervisors.ErrUnreachable, "unreachable"},
		{hypervisors.ErrPermission, "permission"}, {hypervisors.ErrAgentNotReady, "agent-not-ready"},
		{hypervisors.ErrNotOwned, "not-owned"}, {hypervisors.ErrUnsupported, "unsupported"}, {hypervisors.ErrInvalid, "invalid"},
	} {
		if errors.Is(err, c.err) {
			return c.name
		}
	}
	return "other"
}

// Executor runs planned changes.
type Executor struct {
	o      Options
	policy retry.Policy
	mu     sync.Mutex
	zones  map[string]chan struct{}
}

// New returns an Executor.
func New(o Options) *Executor {
	if o.PerZone <= 0 {
		o.PerZone = 8
	}
	policy := retry.Step
	if o.MinBackoff > 0 {
		policy.Initial = o.MinBackoff
	}
	if o.MaxBackoff > 0 {
		policy.Max = o.MaxBackoff
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Guard != nil {
		// Every retry loop of the executor follows this policy, so the
		// term is asked before each attempt, not once per step.
		policy.Before = o.guard
	}
	if o.BlobGrace <= 0 {
		o.BlobGrace = DefaultBlobGrace
	}
	return &Executor{o: o, policy: policy, zones: map[string]chan struct{}{}}
}

// guard asks Guard whether this replica may still act.
func (o Options) guard() error {
	if o.Guard == nil {
		return nil
	}
	if err := o.Guard(); err != nil {
		return fmt.Errorf("not acting: %w", err)
	}
	return nil
}

// Outcome is what a run learned.
type Outcome struct {
	// VMID is the Proxmox VMID of the machine's VM, if a step learned it.
	VMID int
}

// StepError says which step failed.
type StepError struct {
	Step string
	Err  error
}

func (e *StepError) Error() string { return e.Step + ": " + e.Err.Error() }
func (e *StepError) Unwrap() error { return e.Err }

// stepDone is one finished step.
type stepDone struct {
	i    int
	vmid int
	err  error
	took time.Duration
}

// Run applies the change's steps by their dependency graph: a step starts
// once every step it depends on succeeded, so independent steps run
// concurrently (a step that is the only one ready, with none running, runs
// on the caller's goroutine). opID names the transition whose blob an exec-bootstrap
// step delivers. The first step that fails terminally (or ctx ending)
// cancels the rest; its error is returned as a *StepError.
func (e *Executor) Run(ctx context.Context, c planner.Change, opID string) (Outcome, error) {
	var out Outcome
	g, err := newGraph(c.Steps)
	if err != nil {
		return out, fmt.Errorf("steps for %s: %w", c.Machine, err)
	}
	ctx, cancelCause := context.WithCancelCause(ctx)
	defer cancelCause(nil)
	cancel := func() { cancelCause(errStepFailed) }
	if pre := e.prestage(ctx, c, opID); pre != nil {
		ctx = context.WithValue(ctx, prestagedKey{}, pre)
		defer pre.cleanup(ctx)
	}

	n := len(c.Steps)
	pending := make([]int, n) // unfinished dependencies per step
	vmids := make([]int, n)   // the VMID known after each step succeeded
	done := make(chan stepDone)
	// step is step i as it runs: with the VMID its dependencies learned.
	step := func(i int) planner.Step {
		s := c.Steps[i]
		if s.Target.VMID == 0 {
			s.Target.VMID = g.inherited(i, vmids)
		}
		return s
	}
	run := func(i int, s planner.Step) stepDone {
		t0 := time.Now()
		vmid, err := e.runStep(ctx, c.Machine, opID, s)
		return stepDone{i: i, vmid: vmid, err: err, took: time.Since(t0)}
	}
	var ready []int
	for i := range c.Steps {
		if pending[i] = len(g.deps[i]); pending[i] == 0 {
			ready = append(ready, i)
		}
	}
	var first error
	finish := func(d stepDone) {
		s := c.Steps[d.i]
		outcome := "ok"
		if d.err != nil {
			outcome = "error"
		}
		if e.o.Observer != nil {
			e.o.Observer.StepDone(s.Target.Zone, string(s.Action), outcome, d.took)
		}
		if e.o.Record != nil {
			ev := desired.Event{Kind: desired.EventStep, OpID: opID, Action: string(s.Action), Reason: s.Reason,
				DurationMS: d.took.Milliseconds(), Outcome: outcome, Class: ErrorClass(d.err)}
			if d.err != nil {
				ev.Error = d.err.Error()
				if first != nil {
					ev.Outcome = "cancelled" // another step failed first
				}
			}
			e.o.Record(c.Machine, ev)
		}
		if d.err != nil {
			if first != nil {
				e.o.Logger.Debug("step ended after another failed", "machine", c.Machine, "op", opID, "step", s.ID, "err", d.err)
				return
			}
			e.o.Logger.Warn("step failed", "machine", c.Machine, "op", opID, "step", s.ID, "err", d.err)
			first = &StepError{Step: s.ID, Err: d.err}
			cancel()
			return
		}
		// Checked first: the arguments would be boxed (allocated) for every
		// step even when debug is off.
		if e.o.Logger.Enabled(ctx, slog.LevelDebug) {
			e.o.Logger.Debug("step done", "machine", c.Machine, "op", opID, "step", s.ID, "reason", s.Reason)
		}
		vmids[d.i] = g.inherited(d.i, vmids)
		if d.vmid != 0 {
			vmids[d.i] = d.vmid
			out.VMID = d.vmid
		}
		if first != nil {
			return
		}
		for _, j := range g.dependants[d.i] {
			if pending[j]--; pending[j] == 0 {
				ready = append(ready, j)
			}
		}
	}
	running := 0
	for len(ready) > 0 || running > 0 {
		if running == 0 && len(ready) == 1 {
			// A chain: nothing to overlap, so no goroutine to pay for.
			i := ready[0]
			ready = ready[:0]
			finish(run(i, step(i)))
			continue
		}
		for _, i := range ready {
			running++
			s := step(i)
			go func() { done <- run(i, s) }()
		}
		ready = ready[:0]
		finish(<-done)
		running--
	}
	return out, first
}

// graph is a change's validated dependency graph, by step index.
type graph struct {
	deps       [][]int
	dependants [][]int
}

// maxNamed bounds the step ids an invalid-graph error lists.
const maxNamed = 5

// newGraph indexes the steps' dependencies and rejects duplicate ids,
// dependencies on steps outside the change, and cycles.
func newGraph(steps []planner.Step) (*graph, error) {
	index := make(map[string]int, len(steps))
	for i, s := range steps {
		if _, dup := index[s.ID]; dup {
			return nil, fmt.Errorf("%w: two steps share the id %q", hypervisors.ErrInvalid, s.ID)
		}
		index[s.ID] = i
	}
	g := &graph{deps: make([][]int, len(steps)), dependants: make([][]int, len(steps))}
	indegree := make([]int, len(steps))
	for i, s := range steps {
		for _, d := range s.DependsOn {
			j, ok := index[d]
			if !ok {
				return nil, fmt.Errorf("%w: step %q depends on %q, which is not in the change", hypervisors.ErrInvalid, s.ID, d)
			}
			// A dependency named twice counts once. Scanned, not kept in a
			// map per step: a step depends on a few of its change's steps,
			// never more than the change has.
			if slices.Contains(g.deps[i], j) {
				continue
			}
			g.deps[i] = append(g.deps[i], j)
			g.dependants[j] = append(g.dependants[j], i)
			indegree[i]++
		}
	}
	// Kahn: whatever never becomes ready lies on or behind a cycle.
	var ready []int
	for i := range steps {
		if indegree[i] == 0 {
			ready = append(ready, i)
		}
	}
	for k := 0; k < len(ready); k++ {
		for _, j := range g.dependants[ready[k]] {
			if indegree[j]--; indegree[j] == 0 {
				ready = append(ready, j)
			}
		}
	}
	if len(ready) < len(steps) {
		var stuck []string
		for i := range steps {
			if indegree[i] > 0 && len(stuck) < maxNamed {
				stuck = append(stuck, steps[i].ID)
			}
		}
		return nil, fmt.Errorf("%w: the dependencies of %d steps form a cycle (among %s)", hypervisors.ErrInvalid,
			len(steps)-len(ready), strings.Join(stuck, ", "))
	}
	return g, nil
}

// inherited is the first VMID known after one of step i's dependencies.
func (g *graph) inherited(i int, vmids []int) int {
	for _, d := range g.deps[i] {
		if vmids[d] != 0 {
			return vmids[d]
		}
	}
	return 0
}

func (e *Executor) zone(z string) chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	ch := e.zones[z]
	if ch == nil {
		ch = make(chan struct{}, e.o.PerZone)
		e.zones[z] = ch
	}
	return ch
}

func (e *Executor) runStep(ctx context.Context, machine, opID string, s planner.Step) (int, error) {
	info := s.Info()
	if info.Heavy {
		sem := e.zone(s.Target.Zone)
		select {
		case sem <- struct{}{}:
			defer func() { <-sem }()
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	// Asked here too, before ExecStarting records a guest command's start.
	if err := e.o.guard(); err != nil {
		return 0, err
	}
	switch {
	case s.Params.Plugin != nil:
		// A plug-in step is the plug-in's, whatever its name.
	case s.Action == planner.ActionExecBootstrap:
		return 0, e.bootstrap(ctx, machine, opID, s)
	case s.Action == planner.ActionExecDrain:
		return 0, e.drain(ctx, machine, opID, s)
	case s.Action == planner.ActionExecReady:
		return 0, e.ready(ctx, opID, s)
	}
	policy := e.policy
	if opID == "" && e.o.RepairAttempts > 0 {
		policy.Attempts = e.o.RepairAttempts
	}
	return retry.Value(ctx, policy, hypervisors.Retryable, func(ctx context.Context) (int, error) {
		return e.apply(ctx, machine, s, info)
	})
}

// errNotReady marks a readiness probe that has not succeeded yet.
var errNotReady = errors.New("node not ready yet")

func (e *Executor) apply(ctx context.Context, machine string, s planner.Step, info hypervisors.ActionInfo) (int, error) {
	hv := e.o.Hypervisor
	t := s.Target
	p := s.Params
	core := p.Plugin == nil
	if _, known := planner.CoreAction(s.Action); core && !known {
		return 0, fmt.Errorf("%w: step %s has no parameters for its action %q", hypervisors.ErrInvalid, s.ID, s.Action)
	}
	if info.OwnerCheck {
		gone, err := e.checkOwned(ctx, machine, t)
		if err != nil || gone {
			return 0, err
		}
	}
	if !core {
		return hv.Apply(ctx, t, p.Plugin)
	}
	switch s.Action {
	case planner.ActionStart:
		return 0, hv.Start(ctx, t)
	case planner.ActionResume:
		return 0, hv.Resume(ctx, t)
	case planner.ActionWaitAgent:
		return 0, hv.AgentPing(ctx, t)
	case planner.ActionBind, planner.ActionUnbind:
		return 0, hv.SetMarker(ctx, t, *p.Marker)
	case planner.ActionStop:
		return 0, hv.Stop(ctx, t, time.Duration(p.Grace))
	}
	return 0, fmt.Errorf("%w: step %s: the executor does not run %q", hypervisors.ErrInvalid, s.ID, s.Action)
}

// checkOwned re-reads the live VM before a destructive step. gone is true
// when there is nothing left to destroy.
func (e *Executor) checkOwned(ctx context.Context, machine string, t hypervisors.Target) (gone bool, err error) {
	vm, err := e.o.Hypervisor.Lookup(ctx, t)
	if errors.Is(err, hypervisors.ErrNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	if !vm.Owned(e.o.Installation) || vm.Marker.MachineID != machine {
		return false, fmt.Errorf("%w: VM %s does not carry this installation's marker for %s; refusing to destroy it", hypervisors.ErrNotOwned, vm.Ref(), machine)
	}
	return false, nil
}

// opKey names a step's guest command for its transition in the guest's
// records: the operation id and what it runs.
func opKey(opID string, a planner.Action) string {
	return opID + "-" + strings.TrimPrefix(string(a), "exec-")
}

// recorded runs a step's command under the guest-op wrapper (guest.Run):
// at most once for the transition, whoever started it. ExecStarting is
// called once, before the wrapper is first sent.
func (e *Executor) recorded(ctx context.Context, machine, opID string, s planner.Step, op guest.Op) (guest.Outcome, error) {
	op.Key, op.Argv = opKey(opID, s.Action), s.Params.Exec
	op.Retry, op.Wait = e.policy, e.policy
	if e.o.ExecStarting != nil {
		op.Starting = func(ctx context.Context) error { return e.o.ExecStarting(ctx, machine, opID, s.ID) }
	}
	e.o.Logger.Info("guest command starting", "machine", machine, "op", opID, "step", s.ID)
	out, err := guest.Run(ctx, guest.VM{Hypervisor: e.o.Hypervisor, Target: s.Target}, op)
	if e.o.Record != nil {
		ev := desired.Event{Kind: desired.EventGuest, OpID: opID, Action: string(s.Action), Outcome: "ok"}
		if err != nil {
			ev.Outcome, ev.Class, ev.Error = "error", ErrorClass(err), err.Error()
		} else {
			code := out.ExitCode
			ev.Exit = &code
			if code != 0 {
				ev.Outcome = "exited"
			}
		}
		e.o.Record(machine, ev)
	}
	if err == nil && out.Attempt > 0 {
		e.o.Logger.Info("guest command ran under a new attempt", "machine", machine, "op", opID, "step", s.ID, "attempt", out.Attempt)
	}
	return out, err
}

// bootstrap runs the hook at most once for the transition, with the blob
// staged in the guest beforehand (when it is in memory) and put in place
// by the wrapper right before the hook starts. A Configure re-driven after
// a restart or fail-over has no blob in memory: it follows the guest's
// record of the hook, or runs it with the blob an earlier leader staged;
// only a blob that never reached the guest fails it.
func (e *Executor) bootstrap(ctx context.Context, machine, opID string, s planner.Step) error {
	blob, have := e.o.Blob(machine, opID)
	key := opKey(opID, s.Action)
	defer e.removeBlob(ctx, machine, opID, s, key)
	stage := &guest.Stage{Target: s.Params.BlobPath, Data: blob, Have: have, Grace: e.o.BlobGrace,
		Load: func() ([]byte, bool) { return e.o.Blob(machine, opID) }}
	if pre, _ := ctx.Value(prestagedKey{}).(*prestaged); pre != nil {
		stage.Staged = pre.wait(ctx)
	}
	out, err := e.recorded(ctx, machine, opID, s, guest.Op{Stage: stage})
	if !have {
		blob, have = stage.Data, stage.Have // a retry of the Configure may have brought it
	}
	if errors.Is(err, guest.ErrNotStaged) {
		return &failed{BlobNeverDelivered}
	}
	if err != nil {
		return fmt.Errorf("bootstrap hook: %w", err)
	}
	if out.ExitCode != 0 {
		return &failed{fmt.Sprintf("bootstrap hook exited %d: %s", out.ExitCode, hookExcerpt(out.Output, blob, have))}
	}
	return nil
}

// prestagedKey carries a Run's *prestaged to its bootstrap step.
type prestagedKey struct{}

// prestaged is the bootstrap blob staged in the guest as soon as a Run
// starts, alongside the steps before the hook (waiting for the agent,
// binding): the blob lives only in this replica's memory, so the sooner it
// is in the guest, the fewer Configures a leader change can fail.
type prestaged struct {
	e    *Executor
	step planner.Step
	key  string
	done chan struct{}
	ok   bool // staged (valid once done is closed)
	used atomic.Bool
}

// prestage starts staging the blob of c's exec-bootstrap step, if c has
// one, its VM is known and the blob is in memory; nil otherwise.
func (e *Executor) prestage(ctx context.Context, c planner.Change, opID string) *prestaged {
	for i := range c.Steps {
		// Indexed: a range variable the goroutine below captures would be
		// moved to the heap for every step, the ones skipped too.
		if c.Steps[i].Action != planner.ActionExecBootstrap || c.Steps[i].Params.Plugin != nil {
			continue
		}
		s := c.Steps[i]
		blob, have := e.o.Blob(c.Machine, opID)
		if !have || e.o.Identity == planner.ByID && s.Target.VMID == 0 {
			return nil
		}
		p := &prestaged{e: e, step: s, key: opKey(opID, s.Action), done: make(chan struct{})}
		go func() {
			defer close(p.done)
			err := retry.Do(ctx, e.policy, hypervisors.Retryable, func(ctx context.Context) error {
				if e.o.Guard != nil {
					if err := e.o.Guard(); err != nil {
						return fmt.Errorf("not acting: %w", err)
					}
				}
				return e.o.Hypervisor.AgentWriteFile(ctx, s.Target, guest.StagePath(p.key), blob, 0o600)
			})
			p.ok = err == nil
		}()
		return p
	}
	return nil
}

// wait waits for the staging and reports whether it succeeded; the
// bootstrap step that calls it owns the cleanup from then on.
func (p *prestaged) wait(ctx context.Context) bool {
	p.used.Store(true)
	select {
	case <-p.done:
		return p.ok
	case <-ctx.Done():
		return false
	}
}

// cleanup removes a staged blob whose bootstrap step never ran (an
// earlier step failed), unless ctx was cancelled (see removeBlob).
func (p *prestaged) cleanup(ctx context.Context) {
	<-p.done
	if p.used.Load() || !p.ok {
		return
	}
	p.e.removeBlob(ctx, "", "", p.step, p.key)
}

// BlobNeverDelivered starts the last_error of a Configure whose bootstrap
// blob never reached the guest before the replica that accepted it
// stopped: the blob lives only in that replica's memory, so the hook never
// ran and cannot run. Nothing else fails a Configure across a restart or
// fail-over.
const BlobNeverDelivered = "the bootstrap blob never reached the guest before the provider that accepted the Configure stopped; it is kept only in memory, so the hook never ran and cannot run: Configure again"

// errStepFailed is why a Run cancels its other steps when one failed.
var errStepFailed = errors.New("another step of the change failed")

// removeBlob removes the staged and the placed blob after the hook (the
// wrapper removes the placed one itself when the hook ends), whatever
// happened, so no secret stays in the guest; but not when the Run's
// caller cancelled it (leadership lost, shutdown): the next leader may
// still need the staged blob to run the hook.
func (e *Executor) removeBlob(ctx context.Context, machine, opID string, s planner.Step, key string) {
	if errors.Is(ctx.Err(), context.Canceled) && !errors.Is(context.Cause(ctx), errStepFailed) {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeTimeout)
	defer cancel()
	err := retry.Do(rctx, e.policy, removable, func(ctx context.Context) error {
		return guest.Unstage(ctx, guest.VM{Hypervisor: e.o.Hypervisor, Target: s.Target}, key, s.Params.BlobPath)
	})
	if err != nil && !errors.Is(err, hypervisors.ErrNotFound) {
		e.o.Logger.Warn("could not remove bootstrap blob from guest", "machine", machine, "op", opID, "vm", s.Target.Name, "err", err)
	}
}

// hookExcerpt is a failed hook's output for last_error: scrubbed of the
// blob, or withheld when the blob is not in memory to scrub it with (a
// Configure resumed after a restart or fail-over).
func hookExcerpt(out, blob []byte, have bool) string {
	if !have {
		return "(its output is kept in the guest's record but not shown: the bootstrap blob needed to scrub it did not survive the provider's restart)"
	}
	return excerpt(hypervisors.ExecResult{Stdout: out}, blob)
}

// failed is a guest command that ran and failed: terminal (it unwraps to
// hypervisors.ErrInvalid, so it is never retried), and reported as what
// happened rather than as an invalid request.
type failed struct{ msg string }

func (e *failed) Error() string { return e.msg }
func (e *failed) Unwrap() error { return hypervisors.ErrInvalid }

// removable reports whether removing the blob is worth another attempt:
// anything but a class that says it cannot succeed, since a blob left in
// the guest is a secret left behind.
func removable(err error) bool {
	for _, class := range []error{hypervisors.ErrInvalid, hypervisors.ErrPermission, hypervisors.ErrNotFound,
		hypervisors.ErrUnsupported, hypervisors.ErrNotOwned} {
		if errors.Is(err, class) {
			return false
		}
	}
	return true
}

// drain runs the drain command under the guest-op wrapper: once for the
// transition, and again only if the guest proves an earlier run died
// without recording an end (drain is idempotent).
func (e *Executor) drain(ctx context.Context, machine, opID string, s planner.Step) error {
	out, err := e.recorded(ctx, machine, opID, s, guest.Op{Rerun: true})
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	if out.ExitCode != 0 {
		return fmt.Errorf("drain exited %d: %s", out.ExitCode, excerpt(hypervisors.ExecResult{Stdout: out.Output}, nil))
	}
	return nil
}

// ready repeats the readiness probe until it exits 0 or ctx ends. Each
// probe runs under the guest-op wrapper as a repeatable check: never
// while an earlier probe of the transition still runs (one whose answer
// was lost is waited for, not sent again blindly), and its outcome is
// read from the guest's record when its answer is lost. A probe the
// operation's end cuts short is the gate running out of time: its
// outcome is unknown, but a probe is repeatable, so the gate fails with
// ctx's error, naming the probe (retry's interruption), not as a command
// whose outcome matters.
func (e *Executor) ready(ctx context.Context, opID string, s planner.Step) error {
	op := guest.Op{Key: opKey(opID, s.Action), Argv: s.Params.Exec, Repeat: true, Retry: e.policy, Wait: e.policy}
	agent := guest.VM{Hypervisor: e.o.Hypervisor, Target: s.Target}
	return retry.Do(ctx, e.policy, func(err error) bool {
		return errors.Is(err, errNotReady) || hypervisors.Retryable(err) || ctx.Err() != nil
	}, func(ctx context.Context) error {
		out, err := guest.Run(ctx, agent, op)
		if err != nil {
			return fmt.Errorf("readiness check: %w", err)
		}
		op.Delivered = true
		if out.ExitCode != 0 {
			return fmt.Errorf("%w: readiness check exited %d", errNotReady, out.ExitCode)
		}
		return nil
	})
}

// excerpt returns a bounded tail of the command's stderr (or stdout),
// with any occurrence of the blob or of its longer lines redacted.
func excerpt(res hypervisors.ExecResult, blob []byte) string {
	out := res.Stderr
	if len(bytes.TrimSpace(out)) == 0 {
		out = res.Stdout
	}
	out = Scrub(out, blob)
	if len(out) > maxExcerpt {
		out = append([]byte("…"), out[len(out)-maxExcerpt:]...)
	}
	s := strings.TrimSpace(strings.ToValidUTF8(string(out), "?"))
	if s == "" {
		return "(no output)"
	}
	return s
}

// Scrub removes the blob, and every line of it of 8 bytes or more, from b.
func Scrub(b, blob []byte) []byte {
	if len(blob) == 0 {
		return b
	}
	b = bytes.ReplaceAll(b, blob, []byte("[redacted]"))
	for _, line := range bytes.Split(blob, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) >= 8 {
			b = bytes.ReplaceAll(b, line, []byte("[redacted]"))
		}
	}
	return b
}
