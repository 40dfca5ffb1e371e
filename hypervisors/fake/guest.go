package fake

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/observed"
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

// machine is the power and guest state both shapes keep per VM.
type machine struct {
	Power observed.Power `json:"power"`
	// RunningSince is when the VM last went from off to running; the
	// guest agent connects AgentDelay after it.
	RunningSince time.Time `json:"running_since,omitzero"`
	Guest        guest     `json:"guest"`
}

// guest is the simulated inside of a VM.
type guest struct {
	// Files written through the agent; never saved (they hold the blob).
	Files      map[string]guestFile `json:"-"`
	Bootstraps []Bootstrap          `json:"bootstraps,omitempty"`
	// Cluster is the cluster the node last joined.
	Cluster  string `json:"cluster,omitempty"`
	Drains   int    `json:"drains,omitempty"`
	Cordoned bool   `json:"cordoned,omitempty"`
	// Starts counts the commands started in the guest by kind, whatever
	// their outcome (memory only).
	Starts Starts `json:"-"`
}

// Starts counts guest commands that started, by kind.
type Starts struct {
	Bootstrap int
	Drain     int
	Ready     int
	Other     int
}

type guestFile struct {
	Data []byte
	Mode os.FileMode
}

// Bootstrap is one successful run of the simulated bootstrap hook.
type Bootstrap struct {
	Cluster string   `json:"cluster"`
	Argv    []string `json:"argv"`
	// Blob is exactly what the hook consumed; it is kept in memory only.
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
	// Starts counts the commands that started in the guest (whether they
	// ended, failed or their answer was lost).
	Starts Starts
}

func (m *machine) powerOn(now time.Time) {
	if m.Power != observed.PowerRunning && m.Power != observed.PowerPaused {
		m.RunningSince = now
	}
	m.Power = observed.PowerRunning
}

// powerOff stops the VM; tmpfs paths (/run, /tmp) lose their files.
func (m *machine) powerOff(p observed.Power) {
	m.Power = p
	m.RunningSince = time.Time{}
	for path := range m.Guest.Files {
		if strings.HasPrefix(path, "/run/") || strings.HasPrefix(path, "/tmp/") {
			delete(m.Guest.Files, path)
		}
	}
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
	for p, f := range g.Files {
		st.Files[p] = bytes.Clone(f.Data)
		st.Modes[p] = f.Mode
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

// resolver finds the machine behind a target; the caller holds sim.mu.
type resolver interface {
	machineOf(t hypervisors.Target) (*machine, *observed.Marker, error)
	// saveMachine journals the VM behind t after its guest changed.
	saveMachine(t hypervisors.Target)
}

func targetName(t hypervisors.Target) string {
	if t.VMID != 0 {
		return fmt.Sprintf("%s/%d", t.Zone, t.VMID)
	}
	return t.Zone + "/" + t.Name
}

// agentReady fails unless the VM has been running for AgentDelay.
func (s *sim) agentReady(m *machine, t hypervisors.Target) error {
	switch {
	case m.Power != observed.PowerRunning:
		return fmt.Errorf("guest agent of %s: VM is %s: %w", targetName(t), m.Power, hypervisors.ErrAgentNotReady)
	case s.now().Sub(m.RunningSince) < s.opts.AgentDelay:
		return fmt.Errorf("guest agent of %s: not connected: %w", targetName(t), hypervisors.ErrAgentNotReady)
	}
	return nil
}

// AgentPing returns ErrAgentNotReady unless the VM has been running for
// Options.AgentDelay.
func (s *sim) AgentPing(ctx context.Context, t hypervisors.Target) error {
	r := s.vms
	if err := s.enter(ctx, "AgentPing", t.Zone, t); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, _, err := r.machineOf(t)
	if err != nil {
		return fmt.Errorf("agent ping: %w", err)
	}
	return s.agentReady(m, t)
}

// AgentWriteFile stores a file in the simulated guest.
func (s *sim) AgentWriteFile(ctx context.Context, t hypervisors.Target, path string, data []byte, mode os.FileMode) error {
	r := s.vms
	if err := s.enterWrite(ctx, "AgentWriteFile", t.Zone, t); err != nil {
		return err
	}
	if !strings.HasPrefix(path, "/") {
		return fmt.Errorf("agent write %s on %s: path is not absolute: %w", path, targetName(t), hypervisors.ErrInvalid)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, _, err := r.machineOf(t)
	if err != nil {
		return fmt.Errorf("agent write %s: %w", path, err)
	}
	if err := s.agentReady(m, t); err != nil {
		return err
	}
	if m.Guest.Files == nil {
		m.Guest.Files = map[string]guestFile{}
	}
	m.Guest.Files[path] = guestFile{Data: bytes.Clone(data), Mode: mode}
	return nil
}

// AgentRemoveFile deletes a file in the simulated guest; a missing file
// is success.
func (s *sim) AgentRemoveFile(ctx context.Context, t hypervisors.Target, path string) error {
	r := s.vms
	if err := s.enterWrite(ctx, "AgentRemoveFile", t.Zone, t); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, _, err := r.machineOf(t)
	if err != nil {
		return fmt.Errorf("agent remove %s: %w", path, err)
	}
	if err := s.agentReady(m, t); err != nil {
		return err
	}
	delete(m.Guest.Files, path)
	return nil
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
func (s *sim) classify(argv []string) (cmd command, blobPath string, clusterArg bool) {
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

func exited(code int, stdout, stderr string) hypervisors.ExecResult {
	return hypervisors.ExecResult{ExitCode: code, Stdout: []byte(stdout), Stderr: []byte(stderr)}
}

// ExecAnswerOp is the Hook operation that runs after a guest command
// ran (or, for a command that blocks, started) and before its answer
// reaches the caller: an error from it loses the answer, the way a
// timed-out exec-status poll or a dropped connection does, and AgentExec
// returns ErrOutcomeUnknown. An error from the "AgentExec" hook, which runs
// before, means the command never started.
const ExecAnswerOp = "AgentExec/answer"

// AgentExec runs argv in the simulated guest (see package doc) at most
// once, with the error contract of hypervisors.Hypervisor.AgentExec.
// Commands that would block (conformance faults) wait without holding the
// world lock and end with ctx, as an unknown outcome.
func (s *sim) AgentExec(ctx context.Context, t hypervisors.Target, argv []string) (hypervisors.ExecResult, error) {
	r := s.vms
	if err := s.enterWrite(ctx, "AgentExec", t.Zone, t); err != nil {
		return hypervisors.ExecResult{}, err
	}
	if len(argv) == 0 {
		return hypervisors.ExecResult{}, fmt.Errorf("agent exec on %s: empty argv: %w", targetName(t), hypervisors.ErrInvalid)
	}
	res, pid, err := s.runGuest(ctx, r, t, argv)
	if err != nil || pid == 0 {
		return res, err
	}
	if h := s.currentHook(); h != nil {
		if herr := h(ctx, Call{Op: ExecAnswerOp, Zone: t.Zone, Target: t}); herr != nil {
			return hypervisors.ExecResult{}, &hypervisors.UnknownOutcomeError{Command: argv[0], PID: pid,
				Why: fmt.Sprintf("its answer was lost: %v", herr)}
		}
	}
	return res, nil
}

// runGuest starts argv in the guest and waits for it. pid is 0 when the
// command never started (the error says why).
func (s *sim) runGuest(ctx context.Context, r resolver, t hypervisors.Target, argv []string) (res hypervisors.ExecResult, pid int, err error) {
	s.mu.Lock()
	m, marker, err := r.machineOf(t)
	if err == nil {
		err = s.agentReady(m, t)
	}
	if err != nil {
		s.mu.Unlock()
		return hypervisors.ExecResult{}, 0, fmt.Errorf("agent exec %s: %w", argv[0], err)
	}
	s.pids++
	pid = s.pids
	fault := ""
	if s.opts.Faults && marker != nil {
		fault = marker.Cluster
	}
	cmd, blobPath, clusterArg := s.classify(argv)
	switch cmd {
	case cmdReady:
		defer s.mu.Unlock()
		m.Guest.Starts.Ready++
		if fault == FaultReadinessBlock || len(m.Guest.Bootstraps) == 0 {
			return exited(1, "", "node not Ready\n"), pid, nil
		}
		return exited(0, "Ready\n", ""), pid, nil
	case cmdDrain:
		defer s.mu.Unlock()
		m.Guest.Starts.Drain++
		if fault == FaultDrainError {
			return exited(1, "", "simulated drain failure (fault-drain-error)\n"), pid, nil
		}
		m.Guest.Drains++
		m.Guest.Cordoned = true
		r.saveMachine(t)
		return exited(0, "node drained\n", ""), pid, nil
	case cmdUnknown:
		m.Guest.Starts.Other++
		s.mu.Unlock()
		return exited(127, "", argv[0]+": command not found\n"), pid, nil
	}

	// Bootstrap.
	m.Guest.Starts.Bootstrap++
	cluster := ""
	if marker != nil {
		cluster = marker.Cluster
	}
	if clusterArg {
		if len(argv) < 2 {
			s.mu.Unlock()
			return exited(2, "", "usage: "+argv[0]+" <cluster-id>\n"), pid, nil
		}
		cluster = argv[1]
	}
	file, haveBlob := m.Guest.Files[blobPath]
	blob := bytes.Clone(file.Data)
	s.mu.Unlock()

	unknown := func(err error) error {
		return &hypervisors.UnknownOutcomeError{Command: argv[0], PID: pid,
			Why: fmt.Sprintf("it had not exited when the wait ended (%v)", err)}
	}
	switch fault {
	case FaultError:
		return exited(1, "", "simulated bootstrap failure (fault-error)\n"), pid, nil
	case FaultTimeout:
		<-ctx.Done()
		return hypervisors.ExecResult{}, pid, unknown(ctx.Err())
	case FaultSlowOK:
		// The hook runs on in the guest after the provider gives up, as a
		// real one would, and succeeds late: the late success must never
		// turn a FAILED machine CONFIGURED.
		type outcome struct {
			res hypervisors.ExecResult
			err error
		}
		late := make(chan outcome, 1)
		s.tasks.Add(1)
		go func() {
			defer s.tasks.Done()
			timer := time.NewTimer(s.opts.SlowOK)
			defer timer.Stop()
			select {
			case <-timer.C:
			case <-s.stop:
				late <- outcome{err: unknown(errors.New("the simulator closed"))}
				return
			}
			res, err := s.finishBootstrap(r, t, argv, cluster, blobPath, blob, haveBlob, unknown)
			late <- outcome{res, err}
		}()
		select {
		case o := <-late:
			return o.res, pid, o.err
		case <-ctx.Done():
			return hypervisors.ExecResult{}, pid, unknown(ctx.Err())
		}
	}
	res, err = s.finishBootstrap(r, t, argv, cluster, blobPath, blob, haveBlob, unknown)
	return res, pid, err
}

// finishBootstrap is the end of a bootstrap hook: it joins the cluster if
// the blob was there.
func (s *sim) finishBootstrap(r resolver, t hypervisors.Target, argv []string, cluster, blobPath string, blob []byte, haveBlob bool,
	unknown func(error) error) (hypervisors.ExecResult, error) {
	if !haveBlob {
		return exited(1, "", argv[0]+": "+blobPath+": No such file or directory\n"), nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, _, err := r.machineOf(t)
	if err != nil {
		return hypervisors.ExecResult{}, unknown(err)
	}
	sum := sha256.Sum256(blob)
	m.Guest.Bootstraps = append(m.Guest.Bootstraps, Bootstrap{
		Cluster:    cluster,
		Argv:       append([]string(nil), argv...),
		Blob:       blob,
		BlobSHA256: hex.EncodeToString(sum[:]),
		BlobSize:   len(blob),
		At:         s.now(),
	})
	m.Guest.Cluster = cluster
	m.Guest.Cordoned = false
	r.saveMachine(t)
	return exited(0, "joined cluster "+cluster+"\n", ""), nil
}

// Guest returns a copy of a VM's simulated guest, or false if the VM is
// unknown.
func (s *sim) Guest(t hypervisors.Target) (GuestState, bool) {
	r := s.vms
	s.mu.Lock()
	defer s.mu.Unlock()
	m, _, err := r.machineOf(t)
	if err != nil {
		return GuestState{}, false
	}
	return m.Guest.state(), true
}

// GuestFile returns a file written into a VM's guest.
func (s *sim) GuestFile(t hypervisors.Target, path string) ([]byte, bool) {
	g, ok := s.Guest(t)
	data, found := g.Files[path]
	return data, ok && found
}

// Bootstraps returns the successful bootstrap runs of a VM, oldest first.
func (s *sim) Bootstraps(t hypervisors.Target) []Bootstrap {
	g, _ := s.Guest(t)
	return g.Bootstraps
}

// createFault returns the conformance create failure when enabled and
// requested by the offering labels.
func (s *sim) createFault(op string, labels map[string]string) error {
	if s.opts.Faults && labels[CreateFaultLabel] == "error" {
		return fmt.Errorf("%s: simulated create failure (%s=error): %w", op, CreateFaultLabel, hypervisors.ErrInvalid)
	}
	return nil
}

// sameOwner reports whether two markers name the same installation and
// machine.
func sameOwner(a, b *observed.Marker) bool {
	return a != nil && b != nil && a.Installation == b.Installation && a.MachineID == b.MachineID
}

func cloneMarker(m *observed.Marker) *observed.Marker {
	if m == nil {
		return nil
	}
	c := *m
	return &c
}
