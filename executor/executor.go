package executor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/planner"
)

// maxExcerpt bounds hook output copied into last_error.
const maxExcerpt = 512

// Observer receives step outcomes (metrics); it may be nil.
type Observer interface {
	StepDone(action string, outcome string, d time.Duration)
}

// Options configure an Executor.
type Options struct {
	Hypervisor   hypervisors.Hypervisor
	Installation string
	// Blob returns the in-memory bootstrap blob of a Configure.
	Blob func(machineID, opID string) ([]byte, bool)
	// PerZone bounds concurrent host-loading steps per zone.
	PerZone  int
	Logger   *slog.Logger
	Observer Observer
	// Backoff bounds retry sleeps (defaults 100ms .. 2s).
	MinBackoff, MaxBackoff time.Duration
}

// Executor runs planned changes.
type Executor struct {
	o     Options
	mu    sync.Mutex
	zones map[string]chan struct{}
}

// New returns an Executor.
func New(o Options) *Executor {
	if o.PerZone <= 0 {
		o.PerZone = 8
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 100 * time.Millisecond
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 2 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Executor{o: o, zones: map[string]chan struct{}{}}
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

// Run applies the change's steps in order. opID names the transition whose
// blob an exec-bootstrap step delivers. It stops at the first step that
// fails terminally or when ctx is done.
func (e *Executor) Run(ctx context.Context, c planner.Change, opID string) (Outcome, error) {
	var out Outcome
	for i := range c.Steps {
		s := c.Steps[i]
		if s.Target.VMID == 0 && out.VMID != 0 {
			s.Target.VMID = out.VMID
		}
		start := time.Now()
		vmid, err := e.runStep(ctx, c.Machine, opID, s)
		outcome := "ok"
		if err != nil {
			outcome = "error"
		}
		if e.o.Observer != nil {
			e.o.Observer.StepDone(string(s.Action), outcome, time.Since(start))
		}
		if err != nil {
			e.o.Logger.Warn("step failed", "machine", c.Machine, "op", opID, "step", s.ID, "err", err)
			return out, &StepError{Step: s.ID, Err: err}
		}
		e.o.Logger.Debug("step done", "machine", c.Machine, "op", opID, "step", s.ID, "reason", s.Reason)
		if vmid != 0 {
			out.VMID = vmid
		}
	}
	return out, nil
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

// heavy reports whether an action loads the host (disk or CPU), so it is
// bounded per zone; waits and guest execs are not.
func heavy(a planner.Action) bool {
	switch a {
	case planner.ActionWaitAgent, planner.ActionExecBootstrap, planner.ActionExecReady, planner.ActionExecDrain:
		return false
	}
	return true
}

func (e *Executor) runStep(ctx context.Context, machine, opID string, s planner.Step) (int, error) {
	if heavy(s.Action) {
		sem := e.zone(s.Target.Zone)
		select {
		case sem <- struct{}{}:
			defer func() { <-sem }()
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	var vmid int
	err := e.retry(ctx, s.Action == planner.ActionExecReady, func() error {
		var err error
		vmid, err = e.apply(ctx, machine, opID, s)
		return err
	})
	return vmid, err
}

// errNotReady marks a readiness probe that has not succeeded yet.
var errNotReady = errors.New("node not ready yet")

// retry calls f until it succeeds, fails terminally, or ctx is done. With
// untilOK, any failure is retried (a readiness gate).
func (e *Executor) retry(ctx context.Context, untilOK bool, f func() error) error {
	backoff := e.o.MinBackoff
	var last error
	for {
		err := f()
		if err == nil {
			return nil
		}
		if !untilOK && !hypervisors.Retryable(err) {
			return err
		}
		last = err
		jitter := time.Duration(rand.Int64N(int64(backoff)/2 + 1))
		t := time.NewTimer(backoff/2 + jitter)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), last)
		case <-t.C:
		}
		if backoff *= 2; backoff > e.o.MaxBackoff {
			backoff = e.o.MaxBackoff
		}
	}
}

func (e *Executor) apply(ctx context.Context, machine, opID string, s planner.Step) (int, error) {
	hv := e.o.Hypervisor
	t := s.Target
	p := s.Params
	if s.Action.Destructive() && s.Action != planner.ActionDeleteVolume {
		gone, err := e.checkOwned(ctx, machine, t)
		if err != nil || gone {
			return 0, err
		}
	}
	switch s.Action {
	case planner.ActionCreateOverlay:
		return 0, hv.CreateOverlay(ctx, t.Zone, *p.Overlay)
	case planner.ActionCreateSeed:
		return 0, hv.CreateSeed(ctx, t.Zone, *p.Seed)
	case planner.ActionDefine:
		return 0, hv.DefineDomain(ctx, t.Zone, *p.Domain)
	case planner.ActionClone:
		return hv.CloneVM(ctx, t.Zone, *p.Clone)
	case planner.ActionConfigureVM:
		return 0, hv.ConfigureVM(ctx, t, *p.Size)
	case planner.ActionStart:
		return 0, hv.Start(ctx, t)
	case planner.ActionResume:
		return 0, hv.Resume(ctx, t)
	case planner.ActionAutostart:
		return 0, hv.SetAutostart(ctx, t, p.Autostart)
	case planner.ActionWaitAgent:
		return 0, hv.AgentPing(ctx, t)
	case planner.ActionBind, planner.ActionUnbind:
		return 0, hv.SetMarker(ctx, t, *p.Marker)
	case planner.ActionExecBootstrap:
		return 0, e.bootstrap(ctx, machine, opID, s)
	case planner.ActionExecReady:
		res, err := hv.AgentExec(ctx, t, p.Exec)
		if err != nil {
			return 0, err
		}
		if res.ExitCode != 0 {
			return 0, fmt.Errorf("%w: readiness check exited %d", errNotReady, res.ExitCode)
		}
		return 0, nil
	case planner.ActionExecDrain:
		res, err := hv.AgentExec(ctx, t, p.Exec)
		if err != nil {
			return 0, err
		}
		if res.ExitCode != 0 {
			return 0, fmt.Errorf("drain exited %d: %s", res.ExitCode, excerpt(res, nil))
		}
		return 0, nil
	case planner.ActionStop:
		return 0, hv.Stop(ctx, t, time.Duration(p.Grace))
	case planner.ActionUndefine:
		return 0, hv.UndefineDomain(ctx, t)
	case planner.ActionDeleteVM:
		return 0, hv.DeleteVM(ctx, t)
	case planner.ActionDeleteVolume:
		return 0, hv.DeleteVolume(ctx, t.Zone, p.Pool, p.Volume)
	}
	return 0, fmt.Errorf("%w: unknown action %q", hypervisors.ErrInvalid, s.Action)
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

// bootstrap writes the blob, runs the hook to exit and removes the blob.
func (e *Executor) bootstrap(ctx context.Context, machine, opID string, s planner.Step) error {
	hv := e.o.Hypervisor
	blob, ok := e.o.Blob(machine, opID)
	if !ok {
		return fmt.Errorf("%w: the bootstrap blob of %s is no longer in memory (the provider restarted); Configure cannot be resumed", hypervisors.ErrInvalid, opID)
	}
	if err := hv.AgentWriteFile(ctx, s.Target, s.Params.BlobPath, blob, 0o600); err != nil {
		return fmt.Errorf("write bootstrap blob: %w", err)
	}
	defer func() {
		// Remove the blob even when the hook failed or ctx expired.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := hv.AgentRemoveFile(rctx, s.Target, s.Params.BlobPath); err != nil && !errors.Is(err, hypervisors.ErrNotFound) {
			e.o.Logger.Warn("could not remove bootstrap blob from guest", "machine", machine, "vm", s.Target.Name, "err", err)
		}
	}()
	res, err := hv.AgentExec(ctx, s.Target, s.Params.Exec)
	if err != nil {
		return fmt.Errorf("run bootstrap hook: %w", err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("%w: bootstrap hook exited %d: %s", hypervisors.ErrInvalid, res.ExitCode, excerpt(res, blob))
	}
	return nil
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
