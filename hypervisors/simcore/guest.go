package simcore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	guestproto "github.com/bigfleet-vm/provider/hypervisors/guest"
	"github.com/bigfleet-vm/provider/hypervisors/guest/guestsim"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/retry"
)

// Conformance fault names carried in a VM marker's Cluster (Options.Faults).
const (
	FaultError          = "fault-error"
	FaultTimeout        = "fault-timeout"
	FaultSlowOK         = "fault-slow-ok"
	FaultDrainError     = "fault-drain-error"
	FaultReadinessBlock = "fault-readiness-block"
	// CreateFaultLabel with value "error" in DomainSpec.Labels or
	// CloneSpec.Labels makes the create fail with ErrInvalid
	// (Options.Faults).
	CreateFaultLabel = "conformance.fault/create"
)

// Machine is the power and guest state every simulator keeps per VM
// (embedded in its VM record, journaled with it).
type Machine struct {
	Power observed.Power `json:"power"`
	// RunningSince is when the VM last went from off to running; the
	// guest agent connects AgentDelay after it.
	RunningSince time.Time `json:"running_since,omitzero"`
	Guest        guest     `json:"guest"`
}

// guest is the simulated inside of a VM.
type guest struct {
	// Disk is what of the simulated guest is journaled: its boot and its
	// files without their content (they hold the blob).
	Disk       *guestsim.State `json:"disk,omitempty"`
	Bootstraps []Bootstrap     `json:"bootstraps,omitempty"`
	// Cluster is the cluster the node last joined.
	Cluster  string `json:"cluster,omitempty"`
	Drains   int    `json:"drains,omitempty"`
	Cordoned bool   `json:"cordoned,omitempty"`
	// DrainKeys are the guest-op keys of the last maxDrainKeys drains
	// (one per drain run under the wrapper).
	DrainKeys []string `json:"drain_keys,omitempty"`
	// Starts counts the commands started in the guest by kind, whatever
	// their outcome (memory only).
	Starts Starts `json:"-"`

	// sim is the guest its agent reaches, made on first use (from Disk
	// after a load).
	sim *guestsim.Guest
	// dirty: sim changed since Disk was last taken from it.
	dirty bool
}

// Starts counts guest commands that started, by kind.
type Starts struct {
	Bootstrap int
	Drain     int
	Ready     int
	Other     int
}

// maxDrainKeys bounds guest.DrainKeys.
const maxDrainKeys = 64

// Bootstrap is one successful run of the simulated bootstrap hook.
type Bootstrap struct {
	Cluster string   `json:"cluster"`
	Argv    []string `json:"argv"`
	// Key is the guest-op key the hook ran under (its operation id).
	Key string `json:"key,omitempty"`
	// Blob is exactly what the hook consumed; it is kept in memory only
	// (nil when the file's content did not survive a reload).
	Blob       []byte    `json:"-"`
	BlobSHA256 string    `json:"blob_sha256"`
	BlobSize   int       `json:"blob_size"`
	At         time.Time `json:"at"`
}

// GuestState is a copy of a VM's simulated guest.
type GuestState struct {
	// Files maps path to content for files written through the agent.
	Files      map[string][]byte
	Modes      map[string]os.FileMode
	Bootstraps []Bootstrap
	// Cluster is the cluster the node last joined ("" never).
	Cluster  string
	Drains   int
	Cordoned bool
	// DrainKeys are the guest-op keys of the last drains.
	DrainKeys []string
	// Starts counts the commands that started in the guest (whether they
	// ended, failed or their answer was lost).
	Starts Starts
}

// PowerOn runs the VM (from now, unless it was running or paused).
func (m *Machine) PowerOn(now time.Time) {
	if m.Power != observed.PowerRunning && m.Power != observed.PowerPaused {
		m.RunningSince = now
	}
	m.Power = observed.PowerRunning
}

// PowerOff stops the VM (power p): the guest's processes end, and tmpfs paths
// (/run, /tmp) lose their files.
func (m *Machine) PowerOff(p observed.Power) {
	m.Power = p
	m.RunningSince = time.Time{}
	if m.Guest.sim != nil {
		m.Guest.sim.Reboot()
		m.takeDisk()
	}
}

// takeDisk makes Disk what the simulated guest is now.
func (m *Machine) takeDisk() {
	if m.Guest.sim != nil {
		st := m.Guest.sim.State()
		m.Guest.Disk = &st
	}
	m.Guest.dirty = false
}

func (g *guest) state() GuestState {
	st := GuestState{
		Files:    map[string][]byte{},
		Modes:    map[string]os.FileMode{},
		Cluster:  g.Cluster,
		Drains:   g.Drains,
		Cordoned: g.Cordoned,
		Starts:   g.Starts,
	}
	st.DrainKeys = append(st.DrainKeys, g.DrainKeys...)
	if g.sim != nil {
		for _, p := range g.sim.Files() {
			f, _ := g.sim.File(p)
			st.Files[p] = f.Data
			st.Modes[p] = f.Mode
		}
	} else if g.Disk != nil {
		for p, fi := range g.Disk.Files {
			st.Files[p] = nil
			st.Modes[p] = fi.Mode
		}
	}
	for _, b := range g.Bootstraps {
		st.Bootstraps = append(st.Bootstraps, b.clone())
	}
	return st
}

func (b Bootstrap) clone() Bootstrap {
	b.Argv = append([]string(nil), b.Argv...)
	b.Blob = bytes.Clone(b.Blob)
	return b
}

// TargetName names t in errors: zone/VMID or zone/name.
func TargetName(t hypervisors.Target) string {
	if t.VMID != 0 {
		return fmt.Sprintf("%s/%d", t.Zone, t.VMID)
	}
	return t.Zone + "/" + t.Name
}

// agentReady fails unless the VM has been running for AgentDelay.
func (s *Core) agentReady(m *Machine, t hypervisors.Target) error {
	switch {
	case m.Power != observed.PowerRunning:
		return fmt.Errorf("guest agent of %s: VM is %s: %w", TargetName(t), m.Power, hypervisors.ErrAgentNotReady)
	case s.Now().Sub(m.RunningSince) < s.opts.AgentDelay:
		return fmt.Errorf("guest agent of %s: not connected: %w", TargetName(t), hypervisors.ErrAgentNotReady)
	}
	return nil
}

// The Hook operations of the simulated agent's wire, one per request the
// protocol (package guest) makes: an error from the hook fails that
// request before the agent sees it. ExecAnswerOp runs when a status
// request is about to report a command's exit: an error from it loses the
// answer (the agent has forgotten the pid by then, as qemu-ga does), so a
// plain AgentExec returns ErrOutcomeUnknown.
const (
	AgentExecOp   = "agent/exec"
	AgentStatusOp = "agent/exec-status"
	AgentWriteOp  = "agent/file-write"
	ExecAnswerOp  = "AgentExec/answer"
)

// agentPoll paces the protocol's status polls of the simulated guest.
var agentPoll = retry.Policy{Initial: time.Millisecond, Max: 10 * time.Millisecond}

// agentOf returns the guest agent of t as the protocol (package guest)
// drives it.
func (s *Core) agentOf(t hypervisors.Target) *guestproto.Agent {
	return &guestproto.Agent{T: &fakeAgent{s: s, t: t}, Poll: agentPoll}
}

// fakeAgent is the simulated agent's wire: the guestproto.Transport of both
// simulators.
type fakeAgent struct {
	s *Core
	t hypervisors.Target
}

// use runs fn on t's guest with the world locked, once the hook let the
// request through and the agent answers. Whatever it changed (the guest
// marks itself dirty) is journaled as one record of the VM.
func (a *fakeAgent) use(ctx context.Context, op string, argv []string, fn func(m *Machine, g *guestsim.Guest) error) error {
	s := a.s
	if h := s.CurrentHook(); h != nil {
		if err := h(ctx, Call{Op: op, Zone: a.t.Zone, Target: a.t, Argv: argv}); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w: %w", op, hypervisors.ErrTransient, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("%s: fake hypervisor closed: %w", op, hypervisors.ErrUnreachable)
	}
	m, _, err := s.vms.Find(a.t)
	if err == nil {
		err = s.agentReady(m, a.t)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	g := s.guestOf(m, a.t)
	err = fn(m, g)
	if m.Guest.dirty {
		// One record for the whole request: a command's effects and the
		// wrapper's record of its start and end are durable together, as
		// a real guest's wrapper makes "started" durable before the
		// command runs. Saved separately, a crash between them left a
		// world where a drain had run but its record said it never
		// started, and it ran again.
		m.takeDisk()
		s.vms.Save(a.t)
	}
	return err
}

// guestOf returns m's simulated guest, made on first use; s.mu is held.
func (s *Core) guestOf(m *Machine, t hypervisors.Target) *guestsim.Guest {
	if m.Guest.sim == nil {
		progs := s.programs(t)
		changed := func() { m.Guest.dirty = true }
		if m.Guest.Disk != nil {
			m.Guest.sim = guestsim.Restore(*m.Guest.Disk, progs, changed)
		} else {
			m.Guest.sim = guestsim.New(progs, changed)
		}
	}
	return m.Guest.sim
}

func (a *fakeAgent) Ping(ctx context.Context) error {
	return a.use(ctx, "agent/ping", nil, func(*Machine, *guestsim.Guest) error { return nil })
}

// Exec starts argv; any failure before the guest saw it is Refused.
func (a *fakeAgent) Exec(ctx context.Context, argv []string) (int, error) {
	var pid int
	err := a.use(ctx, AgentExecOp, argv, func(_ *Machine, g *guestsim.Guest) error {
		var err error
		pid, err = g.Exec(argv)
		if err != nil {
			return fmt.Errorf("guest-exec %s: %w", argv[0], hypervisors.ErrInvalid)
		}
		return nil
	})
	if err != nil {
		return 0, guestproto.Refused(err)
	}
	return pid, nil
}

func (a *fakeAgent) Status(ctx context.Context, pid int) (guestproto.Status, error) {
	var st guestsim.Status
	err := a.use(ctx, AgentStatusOp, nil, func(_ *Machine, g *guestsim.Guest) error {
		var err error
		st, err = g.Status(pid)
		if errors.Is(err, guestsim.ErrBadPID) {
			return fmt.Errorf("guest-exec-status %d: %w: %w", pid, guestproto.ErrPIDGone, err)
		}
		return err
	})
	if err != nil {
		return guestproto.Status{}, err
	}
	if st.Exited {
		if h := a.s.CurrentHook(); h != nil {
			if herr := h(ctx, Call{Op: ExecAnswerOp, Zone: a.t.Zone, Target: a.t}); herr != nil {
				return guestproto.Status{}, fmt.Errorf("the answer reporting pid %d's exit was lost: %w", pid, herr)
			}
		}
	}
	return guestproto.Status{Exited: st.Exited, ExitCode: st.ExitCode, Signal: st.Signal, Stdout: st.Stdout, Stderr: st.Stderr}, nil
}

func (a *fakeAgent) Write(ctx context.Context, path string, data []byte) error {
	return a.use(ctx, AgentWriteOp, nil, func(_ *Machine, g *guestsim.Guest) error {
		if err := g.Write(path, data); err != nil {
			return fmt.Errorf("guest-file-write %s: %w: %w", path, err, hypervisors.ErrInvalid)
		}
		return nil
	})
}

func (a *fakeAgent) MaxWrite() int { return 0 }

// Wire is t's simulated agent wire as a guest.Transport, for a simulator
// that runs the protocol of package guest over a transport of its own
// making (wrapping this one). Its requests count and fail as the core's
// own (AgentExecOp, AgentStatusOp, AgentWriteOp); the agent method that
// drives them enters first with EnterAgent.
func (s *Core) Wire(t hypervisors.Target) guestproto.Transport { return &fakeAgent{s: s, t: t} }

// EnterAgent enters one guest-agent method op (AgentExec, AgentPing,
// ...) on t the way the core's own agent methods do: it counts it, runs
// the hook (an error means the call never reached the guest), fails it
// when the zone is unreachable or, for a write, the world is read-only,
// waits the latency, and checks the VM's agent answers.
func (s *Core) EnterAgent(ctx context.Context, op string, t hypervisors.Target, argv []string, write bool) error {
	return s.agentCall(ctx, op, t, argv, write)
}

// agentCall enters one guest-agent method: it counts it, runs the hook
// (an error means the call never reached the guest), fails it when the
// zone is unreachable, waits the latency, and finds the VM.
func (s *Core) agentCall(ctx context.Context, op string, t hypervisors.Target, argv []string, write bool) error {
	if err := s.enterCall(ctx, Call{Op: op, Zone: t.Zone, Target: t, Argv: argv}); err != nil {
		return err
	}
	if write && s.opts.ReadOnly {
		return fmt.Errorf("%s: fake world opened read-only: %w", op, hypervisors.ErrPermission)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, _, err := s.vms.Find(t)
	if err != nil {
		return err
	}
	return s.agentReady(m, t)
}

// AgentPing returns ErrAgentNotReady unless the VM has been running for
// Options.AgentDelay.
func (s *Core) AgentPing(ctx context.Context, t hypervisors.Target) error {
	if err := s.agentCall(ctx, "AgentPing", t, nil, false); err != nil {
		return fmt.Errorf("agent ping: %w", err)
	}
	return s.agentOf(t).Ping(ctx)
}

// AgentWriteFile writes a file in the simulated guest with the protocol
// of package guest (private parts, then an atomic rename).
func (s *Core) AgentWriteFile(ctx context.Context, t hypervisors.Target, path string, data []byte, mode os.FileMode) error {
	if err := guestproto.CheckPath(path); err != nil {
		return fmt.Errorf("agent write on %s: %w", TargetName(t), err)
	}
	if err := s.agentCall(ctx, "AgentWriteFile", t, nil, true); err != nil {
		return fmt.Errorf("agent write %s: %w", path, err)
	}
	if err := s.agentOf(t).WriteFile(ctx, path, data, mode); err != nil {
		return fmt.Errorf("agent write %s on %s: %w", path, TargetName(t), err)
	}
	return nil
}

// AgentRemoveFile deletes a file in the simulated guest; a missing file
// is success.
func (s *Core) AgentRemoveFile(ctx context.Context, t hypervisors.Target, path string) error {
	if err := guestproto.CheckPath(path); err != nil {
		return fmt.Errorf("agent remove on %s: %w", TargetName(t), err)
	}
	if err := s.agentCall(ctx, "AgentRemoveFile", t, nil, true); err != nil {
		return fmt.Errorf("agent remove %s: %w", path, err)
	}
	if err := s.agentOf(t).RemoveFile(ctx, path); err != nil {
		return fmt.Errorf("agent remove %s on %s: %w", path, TargetName(t), err)
	}
	return nil
}

// AgentExec runs argv in the simulated guest (see package doc) at most
// once, with the protocol of package guest and the error contract of
// hypervisors.Hypervisor.AgentExec.
func (s *Core) AgentExec(ctx context.Context, t hypervisors.Target, argv []string) (hypervisors.ExecResult, error) {
	if len(argv) == 0 {
		return hypervisors.ExecResult{}, fmt.Errorf("agent exec on %s: empty argv: %w", TargetName(t), hypervisors.ErrInvalid)
	}
	if err := s.agentCall(ctx, "AgentExec", t, argv, true); err != nil {
		return hypervisors.ExecResult{}, fmt.Errorf("agent exec %s: %w", argv[0], err)
	}
	res, err := s.agentOf(t).Exec(ctx, argv)
	if err != nil {
		return res, fmt.Errorf("agent exec on %s: %w", TargetName(t), err)
	}
	return res, nil
}

type command int

const (
	cmdUnknown command = iota
	cmdBootstrap
	cmdDrain
	cmdReady
)

// classify says what the simulated guest does with argv, and for a
// bootstrap which file holds the blob and whether argv names the cluster.
func (s *Core) classify(argv []string) (cmd command, blobPath string, clusterArg bool) {
	switch {
	case argv[0] == s.opts.ReadyCommand:
		return cmdReady, "", false
	case argv[0] == s.opts.BootstrapHook:
		return cmdBootstrap, s.opts.BlobPath, true
	case argv[len(argv)-1] == s.opts.BootstrapPath:
		return cmdBootstrap, s.opts.BootstrapPath, false
	case argv[0] == s.opts.DrainCommand:
		return cmdDrain, "", false
	}
	joined := strings.Join(argv, " ")
	if strings.Contains(joined, "kubectl") && strings.Contains(joined, "drain") {
		return cmdDrain, "", false
	}
	return cmdUnknown, "", false
}

func exited(code int, stdout, stderr string) guestsim.Run {
	return guestsim.Run{ExitCode: code, Stdout: stdout, Stderr: stderr}
}

// programs are the commands of t's simulated guest (see package doc).
// They run with the world locked (every request of the simulated agent
// holds s.mu).
func (s *Core) programs(t hypervisors.Target) guestsim.Programs {
	return func(argv []string) (guestsim.Program, bool) {
		return func(p *guestsim.Proc) guestsim.Run { return s.run(t, p) }, true
	}
}

// run runs a command in t's guest; s.mu is held.
func (s *Core) run(t hypervisors.Target, p *guestsim.Proc) guestsim.Run {
	r := s.vms
	argv := p.Argv
	m, marker, err := r.Find(t)
	if err != nil {
		return exited(127, "", "no such VM\n")
	}
	fault := ""
	if s.opts.Faults && marker != nil {
		fault = marker.Cluster
	}
	cmd, blobPath, clusterArg := s.classify(argv)
	took := func(run guestsim.Run) guestsim.Run { run.For = s.opts.Latency; return run }
	switch cmd {
	case cmdReady:
		m.Guest.Starts.Ready++
		if fault == FaultReadinessBlock || len(m.Guest.Bootstraps) == 0 {
			return exited(1, "", "node not Ready\n")
		}
		return exited(0, "Ready\n", "")
	case cmdDrain:
		m.Guest.Starts.Drain++
		if fault == FaultDrainError {
			return took(exited(1, "", "simulated drain failure (fault-drain-error)\n"))
		}
		m.Guest.Drains++
		m.Guest.Cordoned = true
		if p.Key != "" {
			m.Guest.DrainKeys = append(m.Guest.DrainKeys, p.Key)
			if n := len(m.Guest.DrainKeys); n > maxDrainKeys {
				m.Guest.DrainKeys = append([]string(nil), m.Guest.DrainKeys[n-maxDrainKeys:]...)
			}
		}
		m.Guest.dirty = true // saved by the request that started it
		return took(exited(0, "node drained\n", ""))
	case cmdUnknown:
		m.Guest.Starts.Other++
		return exited(127, "", argv[0]+": command not found\n")
	}

	// Bootstrap.
	m.Guest.Starts.Bootstrap++
	cluster := ""
	if marker != nil {
		cluster = marker.Cluster
	}
	if clusterArg {
		if len(argv) < 2 {
			return exited(2, "", "usage: "+argv[0]+" <cluster-id>\n")
		}
		cluster = argv[1]
	}
	blob, haveBlob := p.Stat(blobPath)
	if !haveBlob {
		return exited(1, "", argv[0]+": "+blobPath+": No such file or directory\n")
	}
	switch fault {
	case FaultError:
		return exited(1, "", "simulated bootstrap failure (fault-error)\n")
	case FaultTimeout:
		return guestsim.Run{Forever: true}
	case FaultSlowOK:
		// The hook runs on in the guest after the provider gives up, as a
		// real one would, and succeeds late (when the agent is asked, or
		// when its time comes): the late success must never turn a FAILED
		// machine CONFIGURED.
		s.tasks.Add(1)
		go func() {
			defer s.tasks.Done()
			timer := time.NewTimer(s.opts.SlowOK)
			defer timer.Stop()
			select {
			case <-timer.C:
			case <-s.stop:
				return
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if m, _, err := r.Find(t); err == nil && m.Guest.sim != nil {
				m.Guest.sim.Settle()
				if m.Guest.dirty {
					m.takeDisk()
					r.Save(t)
				}
			}
		}()
		return guestsim.Run{For: s.opts.SlowOK, Exit: func(*guestsim.Proc) guestsim.Run {
			if m, _, err := r.Find(t); err == nil {
				s.joined(m, p.Key, argv, cluster, blob)
			}
			return exited(0, "joined cluster "+cluster+"\n", "")
		}}
	}
	s.joined(m, p.Key, argv, cluster, blob)
	return took(exited(0, "joined cluster "+cluster+"\n", ""))
}

// joined records a successful bootstrap; s.mu is held.
func (s *Core) joined(m *Machine, key string, argv []string, cluster string, blob guestsim.File) {
	m.Guest.Bootstraps = append(m.Guest.Bootstraps, Bootstrap{
		Cluster:    cluster,
		Argv:       append([]string(nil), argv...),
		Key:        key,
		Blob:       blob.Data,
		BlobSHA256: blob.Sum,
		BlobSize:   blob.Size,
		At:         s.Now(),
	})
	m.Guest.Cluster = cluster
	m.Guest.Cordoned = false
	m.Guest.dirty = true // saved by the request (or the settling) that ended it
}

// Guest returns a copy of a VM's simulated guest, or false if the VM is
// unknown.
func (s *Core) Guest(t hypervisors.Target) (GuestState, bool) {
	r := s.vms
	s.mu.Lock()
	defer s.mu.Unlock()
	m, _, err := r.Find(t)
	if err != nil {
		return GuestState{}, false
	}
	return m.Guest.state(), true
}

// GuestFile returns a file written into a VM's guest.
func (s *Core) GuestFile(t hypervisors.Target, path string) ([]byte, bool) {
	g, ok := s.Guest(t)
	data, found := g.Files[path]
	return data, ok && found
}

// Bootstraps returns the successful bootstrap runs of a VM, oldest first.
func (s *Core) Bootstraps(t hypervisors.Target) []Bootstrap {
	g, _ := s.Guest(t)
	return g.Bootstraps
}

// CreateFault returns the conformance create failure when enabled and
// requested by the offering labels.
func (s *Core) CreateFault(op string, labels map[string]string) error {
	if s.opts.Faults && labels[CreateFaultLabel] == "error" {
		return fmt.Errorf("%s: simulated create failure (%s=error): %w", op, CreateFaultLabel, hypervisors.ErrInvalid)
	}
	return nil
}

// SameOwner reports whether two markers name the same installation and
// machine.
func SameOwner(a, b *observed.Marker) bool {
	return a != nil && b != nil && a.Installation == b.Installation && a.MachineID == b.MachineID
}

// CloneMarker copies m (nil stays nil).
func CloneMarker(m *observed.Marker) *observed.Marker {
	if m == nil {
		return nil
	}
	c := *m
	return &c
}
