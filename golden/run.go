package golden

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/tools/txtar"
	"gopkg.in/yaml.v3"

	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/executor"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/internal/planschema"
	"github.com/bigfleet-vm/provider/jsonplan"
	"github.com/bigfleet-vm/provider/naming"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/planner"
	"github.com/bigfleet-vm/provider/reconciler"
)

// Section names of a case file.
const (
	secConfig   = "config.yaml"
	secDesired  = "desired.yaml"
	secObserved = "observed.yaml"
	secNow      = "now"
	secText     = "plan.txt"
	secJSON     = "plan.json"
)

// maxRounds bounds apply/observe/re-plan rounds: a failed transition
// needs a second round to reap what it left, nothing needs more than three.
const maxRounds = 4

// caseConfig is config.yaml.
type caseConfig struct {
	Shape        string   `yaml:"shape"`
	Installation string   `yaml:"installation"`
	Zones        []string `yaml:"zones"`
	Lineage      string   `yaml:"lineage"`
	Serial       uint64   `yaml:"serial"`
	Planner      struct {
		ReapFailed    *bool    `yaml:"reap_failed"`
		NodeReadyExec []string `yaml:"node_ready_exec"`
		StopGrace     string   `yaml:"stop_grace"`
		// Keys are the hypervisor plug-in's own planner settings
		// (Setup.Planner checks them).
		Keys map[string]string `yaml:",inline"`
	} `yaml:"planner"`
	// Types is the catalog the reconciler resolves adopted orphans with.
	Types map[string]struct {
		VCPU      int `yaml:"vcpu"`
		MemoryMiB int `yaml:"memory_mib"`
	} `yaml:"types"`
	// ExpectConverged false (with Reason) marks a situation that
	// legitimately cannot converge to an empty plan.
	ExpectConverged *bool  `yaml:"expect-converged"`
	Reason          string `yaml:"reason"`
	// Bug names a known planner/reconciler defect this case exposes; the
	// case keeps the correct expectation and fails until it is fixed.
	Bug string `yaml:"bug"`
}

type intentYAML struct {
	Kind     string `yaml:"kind"`
	Op       string `yaml:"op"`
	Started  string `yaml:"started"`
	Deadline string `yaml:"deadline"`
	Grace    int64  `yaml:"grace"`
	// Execs lists steps whose guest command started before a restart.
	Execs []string `yaml:"execs"`
}

type machineYAML struct {
	ID        string            `yaml:"id"`
	Zone      string            `yaml:"zone"`
	Type      string            `yaml:"type"`
	Capacity  string            `yaml:"capacity"`
	VCPU      int               `yaml:"vcpu"`
	MemoryMiB int               `yaml:"memory_mib"`
	Source    int               `yaml:"template_vmid"`
	State     string            `yaml:"state"`
	Since     string            `yaml:"since"`
	Host      string            `yaml:"host"`
	Cycle     int               `yaml:"cycle"`
	VMName    string            `yaml:"vm_name"`
	VMID      int               `yaml:"vmid"`
	Cluster   string            `yaml:"cluster"`
	LastError string            `yaml:"last_error"`
	Slotless  bool              `yaml:"slotless"`
	Intent    *intentYAML       `yaml:"intent"`
	Ops       map[string]string `yaml:"ops"`
	// Blob is the in-memory bootstrap blob of a Configure; it must never
	// appear in a plan.
	Blob string `yaml:"blob"`
}

type desiredYAML struct {
	Machines []machineYAML `yaml:"machines"`
}

type vmYAML struct {
	// Name may use ${id}: the VM name of machine id (its vm_name, or the
	// cycle-1 name when the machine is not in desired.yaml).
	Name string `yaml:"name"`
	// Owner is the machine id in the ownership marker; empty: no marker.
	Owner string `yaml:"owner"`
	// Installation in the marker (default: this installation).
	Installation string `yaml:"installation"`
	Op           string `yaml:"op"`
	Type         string `yaml:"type"`
	Cluster      string `yaml:"cluster"`
	Power        string `yaml:"power"`
	VCPU         int    `yaml:"vcpu"`
	MemoryMiB    int    `yaml:"memory_mib"`
	Autostart    *bool  `yaml:"autostart"`
	// VMID: Proxmox; for a foreign VM the VMID it takes, for an owned VM
	// the VMID the simulator must allocate (checked).
	VMID int `yaml:"vmid"`
}

type zoneYAML struct {
	Name   string `yaml:"name"`
	Status string `yaml:"status"`
	// At backdates the observation (e.g. "now-10m").
	At  string   `yaml:"at"`
	VMs []vmYAML `yaml:"vms"`
	// Volumes are extra libvirt volumes (overlay "*-disk.qcow2" or seed
	// "*-cidata.iso"), e.g. left by a half-built create. A seed holds the
	// seed its machine needs, unless the name is followed by " blank"
	// (created, never uploaded) or " stale" (built from other inputs).
	Volumes []string `yaml:"volumes"`
}

type observedYAML struct {
	Zones []zoneYAML `yaml:"zones"`
}

// goldenCase is one parsed case file.
type goldenCase struct {
	name    string
	path    string
	archive *txtar.Archive
	cfg     caseConfig
	desired desiredYAML
	obs     observedYAML
	now     time.Time
	setup   Setup
	plugin  planner.Plugin
	update  bool
	byID    map[string]*machineYAML
}

// Setup is what the runner needs of one hypervisor: its planner and a
// simulated world to apply plans to. A plug-in's tests run the golden
// cases of its own testdata with it (Run).
type Setup struct {
	// Name is the hypervisor, as config.yaml's shape names it.
	Name string
	// Zones are the zones of a case that names none.
	Zones []string
	// Type is the instance type of a machine that names none, and
	// SourceID its Source (0: none).
	Type     string
	SourceID int
	// Planner builds the plug-in's planner from the plug-in's keys of
	// config.yaml's planner section; an unknown key is an error.
	Planner func(keys map[string]string) (planner.Plugin, error)
	// World opens an empty simulated world of zones on clock now.
	World func(zones []string, now func() time.Time) World
}

// World is a simulated hypervisor a case's observed.yaml is loaded into.
type World interface {
	hypervisors.Hypervisor
	// AddVM adds a VM carrying mk (nil: no marker); owned says mk is this
	// installation's. vmid is the VMID a foreign VM takes, or the one an
	// owned VM must be given (0: any). Power is applied after.
	AddVM(zone, name string, vmid int, mk *observed.Marker, owned bool, power observed.Power) (hypervisors.Target, error)
	ResizeVM(t hypervisors.Target, vcpu, memoryMiB int) error
	SetAutostart(ctx context.Context, t hypervisors.Target, on bool) error
	SetUnreachable(zone string, on bool)
	// AddFixture adds one line of a zone's `volumes:` list: an object of
	// the plug-in's own (libvirt: a volume). ErrUnsupported if it has none.
	AddFixture(zone, line string, fx Fixture) error
}

// Fixture is what a fixture line may refer to.
type Fixture struct {
	// Machines maps each VM name of desired.yaml to its machine id.
	Machines map[string]string
	// Keys are the plug-in's planner keys of config.yaml.
	Keys map[string]string
}

// Run runs every case file of dir (*.txtar) against the setup its
// config.yaml names; update rewrites the expected plans instead of
// comparing them. min is the number of cases the suite promises.
func Run(t *testing.T, dir string, update bool, min int, setups ...Setup) {
	files, err := filepath.Glob(filepath.Join(dir, "*.txtar"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < min {
		t.Errorf("only %d golden cases in %s; the suite promises at least %d", len(files), dir, min)
	}
	for _, path := range files {
		name := strings.TrimSuffix(filepath.Base(path), ".txtar")
		t.Run(name, func(t *testing.T) {
			c := load(t, path, setups)
			c.update = update
			c.run(t)
		})
	}
}

func load(t *testing.T, path string, setups []Setup) *goldenCase {
	t.Helper()
	a, err := txtar.ParseFile(path)
	if err != nil {
		t.Fatal(err)
	}
	c := &goldenCase{name: strings.TrimSuffix(filepath.Base(path), ".txtar"), path: path, archive: a, byID: map[string]*machineYAML{}}
	strict := func(sec string, into any) {
		dec := yaml.NewDecoder(bytes.NewReader(c.section(t, sec)))
		dec.KnownFields(true)
		if err := dec.Decode(into); err != nil && !errors.Is(err, io.EOF) {
			t.Fatalf("%s: %v", sec, err)
		}
	}
	strict(secConfig, &c.cfg)
	strict(secDesired, &c.desired)
	strict(secObserved, &c.obs)
	c.now, err = time.Parse(time.RFC3339, strings.TrimSpace(string(c.section(t, secNow))))
	if err != nil {
		t.Fatalf("now: %v", err)
	}
	var names []string
	byName := map[string]Setup{}
	for _, s := range setups {
		names = append(names, s.Name)
		byName[s.Name] = s
	}
	var ok bool
	if c.setup, ok = byName[c.cfg.Shape]; !ok {
		t.Fatalf("config.yaml: shape %q: want one of %s", c.cfg.Shape, strings.Join(names, ", "))
	}
	if c.plugin, err = c.setup.Planner(c.cfg.Planner.Keys); err != nil {
		t.Fatalf("config.yaml: planner: %v", err)
	}
	if err := planner.CheckPlugin(c.plugin); err != nil {
		t.Fatal(err)
	}
	if c.cfg.Installation == "" {
		c.cfg.Installation = "gold"
	}
	if len(c.cfg.Zones) == 0 {
		c.cfg.Zones = c.setup.Zones
	}
	if c.cfg.ExpectConverged != nil && !*c.cfg.ExpectConverged && c.cfg.Reason == "" {
		t.Fatalf("config.yaml: expect-converged: false needs a reason")
	}
	for i := range c.desired.Machines {
		m := &c.desired.Machines[i]
		if c.byID[m.ID] != nil {
			t.Fatalf("desired.yaml: machine %s twice", m.ID)
		}
		c.byID[m.ID] = m
	}
	return c
}

func (c *goldenCase) section(t *testing.T, name string) []byte {
	t.Helper()
	for _, f := range c.archive.Files {
		if f.Name == name {
			return f.Data
		}
	}
	if name == secText || name == secJSON {
		return nil
	}
	t.Fatalf("%s: no section %q", c.path, name)
	return nil
}

// clock is the one clock of a case: the simulator, the document and the
// planner all read it.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// at parses "now", "now-10m", "now+1h" or an RFC 3339 time.
func (c *goldenCase) at(t *testing.T, s string, def time.Time) time.Time {
	t.Helper()
	s = strings.TrimSpace(s)
	switch {
	case s == "":
		return def
	case s == "now":
		return c.now
	case strings.HasPrefix(s, "now"):
		d, err := time.ParseDuration(strings.TrimPrefix(strings.TrimPrefix(s, "now"), "+"))
		if err != nil {
			t.Fatalf("time %q: %v", s, err)
		}
		return c.now.Add(d)
	}
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatalf("time %q: %v", s, err)
	}
	return v
}

var nameRef = regexp.MustCompile(`\$\{([^}]+)\}`)

// expand replaces ${id} with the VM name of machine id.
func (c *goldenCase) expand(s string) string {
	return nameRef.ReplaceAllStringFunc(s, func(ref string) string {
		id := ref[2 : len(ref)-1]
		if m := c.byID[id]; m != nil {
			if n := c.vmName(m); n != "" {
				return n
			}
		}
		return naming.VMName(c.cfg.Installation, id, 1)
	})
}

func (c *goldenCase) vmName(m *machineYAML) string {
	if m.VMName != "" {
		return m.VMName
	}
	cycle := m.Cycle
	if cycle == 0 && m.State != "" && m.State != "SPECULATIVE" {
		cycle = 1
	}
	if cycle == 0 {
		return ""
	}
	return naming.VMName(c.cfg.Installation, m.ID, cycle)
}

func (c *goldenCase) defaultType() string { return c.setup.Type }

// machines builds the desired machines of desired.yaml, sorted by id.
func (c *goldenCase) machines(t *testing.T) []*desired.Machine {
	t.Helper()
	var out []*desired.Machine
	for i := range c.desired.Machines {
		y := &c.desired.Machines[i]
		state, ok := desired.ParseState(y.State)
		if !ok {
			t.Fatalf("desired.yaml: machine %s: unknown state %q", y.ID, y.State)
		}
		m := &desired.Machine{
			ID: y.ID, Zone: y.Zone, InstanceType: y.Type, Capacity: y.Capacity,
			VCPU: y.VCPU, MemoryMiB: y.MemoryMiB, Source: y.Source,
			Slotless: y.Slotless, State: state, Since: c.at(t, y.Since, c.now.Add(-time.Hour)),
			Host: y.Host, Cycle: y.Cycle, VMName: c.vmName(y), VMID: y.VMID, Cluster: y.Cluster,
			LastError: y.LastError, Ops: map[desired.Kind]desired.OpRecord{},
		}
		if m.Zone == "" {
			m.Zone = c.cfg.Zones[0]
		}
		if m.InstanceType == "" {
			m.InstanceType = c.defaultType()
		}
		if m.Capacity == "" {
			m.Capacity = desired.OnDemand
		}
		if m.VCPU == 0 {
			m.VCPU = 2
		}
		if m.MemoryMiB == 0 {
			m.MemoryMiB = 2048
		}
		if m.Source == 0 {
			m.Source = c.setup.SourceID
		}
		if m.Cycle == 0 && m.VMName != "" {
			m.Cycle = 1
		}
		for k, op := range y.Ops {
			m.Ops[desired.Kind(k)] = desired.OpRecord{ID: op}
		}
		if in := y.Intent; in != nil {
			started := c.at(t, in.Started, c.now.Add(-time.Minute))
			m.Intent = &desired.Intent{Kind: desired.Kind(in.Kind), OpID: in.Op, Started: started,
				Deadline: c.at(t, in.Deadline, started.Add(5*time.Minute)), GraceSeconds: in.Grace}
			for _, e := range in.Execs {
				m.Intent.Execs = append(m.Intent.Execs, c.expand(e))
			}
			if m.Intent.OpID == "" {
				m.Intent.OpID = "op-9"
			}
			if _, ok := m.Ops[m.Intent.Kind]; !ok {
				m.Ops[m.Intent.Kind] = desired.OpRecord{ID: m.Intent.OpID}
			}
			if y.Since == "" {
				m.Since = started
			}
		}
		if _, ok := m.Ops[desired.KindCreate]; !ok && m.Cycle > 0 && state != desired.Deleting {
			m.Ops[desired.KindCreate] = desired.OpRecord{ID: "op-1"}
		}
		if m.Host == "" && m.VMName != "" && state != desired.Creating && state != desired.Speculative {
			if m.VMID != 0 {
				m.Host = m.Zone + "/" + strconv.Itoa(m.VMID)
			} else if c.plugin.Observation().Identity == planner.ByName {
				m.Host = m.Zone + "/" + m.VMName
			}
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (c *goldenCase) plannerConfig(t *testing.T) planner.Config {
	pc := planner.Config{Installation: c.cfg.Installation, StopGrace: 60 * time.Second, ReapFailed: true,
		NodeReadyExec: c.cfg.Planner.NodeReadyExec}
	if c.cfg.Planner.ReapFailed != nil {
		pc.ReapFailed = *c.cfg.Planner.ReapFailed
	}
	if g := c.cfg.Planner.StopGrace; g != "" {
		d, err := time.ParseDuration(g)
		if err != nil {
			t.Fatalf("config.yaml: stop_grace: %v", err)
		}
		pc.StopGrace = d
	}
	pc.Plugin = c.plugin
	return pc
}

// world loads observed.yaml into a fresh simulator.
func (c *goldenCase) world(t *testing.T, clk *clock) World {
	t.Helper()
	ctx := context.Background()
	sim := c.setup.World(c.cfg.Zones, clk.Now)
	var unreachable []string
	for _, z := range c.obs.Zones {
		for _, v := range z.VMs {
			name := c.expand(v.Name)
			power := observed.Power(v.Power)
			if power == "" {
				power = observed.PowerRunning
			}
			var mk *observed.Marker
			owner := c.byID[v.Owner]
			if v.Owner != "" {
				mk = &observed.Marker{Installation: c.cfg.Installation, MachineID: v.Owner, OpID: v.Op, InstanceType: v.Type, Cluster: v.Cluster}
				if v.Installation != "" {
					mk.Installation = v.Installation
				}
				if owner != nil {
					if mk.OpID == "" && owner.Ops["create"] != "" {
						mk.OpID = owner.Ops["create"]
					}
					if mk.OpID == "" && owner.Intent != nil && owner.Intent.Kind == "create" {
						mk.OpID = owner.Intent.Op
					}
					if mk.OpID == "" && c.vmName(owner) != "" && owner.State != "DELETING" {
						mk.OpID = "op-1"
					}
					if mk.InstanceType == "" {
						mk.InstanceType = owner.Type
					}
					if mk.Cluster == "" && (owner.State == "CONFIGURED" || owner.State == "DRAINING") {
						mk.Cluster = owner.Cluster
					}
				}
				if mk.InstanceType == "" {
					mk.InstanceType = c.defaultType()
				}
			}
			owned := mk != nil && mk.Installation == c.cfg.Installation
			vcpu, mem := v.VCPU, v.MemoryMiB
			if owner != nil {
				if vcpu == 0 {
					vcpu = owner.VCPU
				}
				if mem == 0 {
					mem = owner.MemoryMiB
				}
			}
			if vcpu == 0 {
				vcpu = 2
			}
			if mem == 0 {
				mem = 2048
			}
			autostart := owned
			if v.Autostart != nil {
				autostart = *v.Autostart
			}
			target, err := sim.AddVM(z.Name, name, v.VMID, mk, owned, power)
			if err == nil && (vcpu != 2 || mem != 2048) {
				err = sim.ResizeVM(target, vcpu, mem)
			}
			if err == nil && autostart {
				err = sim.SetAutostart(ctx, target, true)
			}
			if err != nil {
				t.Fatalf("observed.yaml: zone %s VM %s: %v", z.Name, name, err)
			}
		}
		for _, line := range z.Volumes {
			fx := Fixture{Machines: map[string]string{}, Keys: c.cfg.Planner.Keys}
			for id, m := range c.byID {
				if vm := c.vmName(m); vm != "" {
					fx.Machines[vm] = id
				}
			}
			if err := sim.AddFixture(z.Name, c.expand(line), fx); err != nil {
				t.Fatalf("observed.yaml: zone %s volume %s: %v", z.Name, line, err)
			}
		}
		switch z.Status {
		case "", "ok":
		case "unknown":
			unreachable = append(unreachable, z.Name)
		default:
			t.Fatalf("observed.yaml: zone %s: status %q: want ok or unknown", z.Name, z.Status)
		}
	}
	for _, z := range unreachable {
		sim.SetUnreachable(z, true)
	}
	return sim
}

// observe lists every zone the way reconciler.ObserveAll does.
func (c *goldenCase) observe(t *testing.T, hv hypervisors.Hypervisor, now time.Time, first bool) *observed.Snapshot {
	t.Helper()
	snap := &observed.Snapshot{Zones: map[string]*observed.Zone{}, At: now}
	for _, z := range hv.Zones() {
		obs, err := hv.Observe(context.Background(), z)
		if err != nil {
			obs = observed.Unknown(z, err, now)
		} else {
			obs.At = now
			if c.plugin.Observation().Volumes {
				obs.VolumesAt = now
			}
		}
		snap.Zones[z] = obs
	}
	if first {
		for _, zy := range c.obs.Zones {
			if zy.At != "" && snap.Zones[zy.Name] != nil {
				at := c.at(t, zy.At, now)
				snap.Zones[zy.Name].At = at
				if !snap.Zones[zy.Name].VolumesAt.IsZero() {
					snap.Zones[zy.Name].VolumesAt = at
				}
			}
		}
	}
	return snap
}

func (c *goldenCase) build(t *testing.T, machines []*desired.Machine, snap *observed.Snapshot, now time.Time) *planner.Plan {
	lineage := c.cfg.Lineage
	if lineage == "" {
		lineage = "golden"
	}
	return planner.Build(planner.Inputs{Config: c.plannerConfig(t), Machines: machines, Observed: snap,
		Lineage: lineage, Serial: c.cfg.Serial, Now: now})
}

func (c *goldenCase) run(t *testing.T) {
	clk := &clock{t: c.now}
	hv := c.world(t, clk)
	defer hv.Close()
	snap := c.observe(t, hv, c.now, true)
	machines := c.machines(t)
	plan := c.build(t, machines, snap, c.now)

	gotJSON, err := planner.MarshalJSON(plan)
	if err != nil {
		t.Fatal(err)
	}
	if err := planschema.Validate(gotJSON); err != nil {
		t.Errorf("the plan does not validate against docs/plan.schema.json: %v", err)
	}
	var text bytes.Buffer
	if err := jsonplan.RenderText(&text, gotJSON, jsonplan.TextOptions{}); err != nil {
		t.Fatal(err)
	}

	// Determinism and round trip.
	again, _ := planner.MarshalJSON(c.build(t, c.machines(t), c.observe(t, hv, c.now, true), c.now))
	if diff := cmp.Diff(string(gotJSON), string(again)); diff != "" {
		t.Errorf("planning the same inputs twice differs (-first +second):\n%s", diff)
	}
	decoded, err := jsonplan.Decode(gotJSON)
	if err != nil {
		t.Fatal(err)
	}
	if rt, _ := jsonplan.Marshal(decoded); !bytes.Equal(rt, gotJSON) {
		t.Errorf("JSON plan does not round-trip:\n%s", cmp.Diff(string(gotJSON), string(rt)))
	}
	// Secrets.
	for _, m := range c.desired.Machines {
		if m.Blob == "" {
			continue
		}
		if bytes.Contains(gotJSON, []byte(m.Blob)) || bytes.Contains(text.Bytes(), []byte(m.Blob)) {
			t.Errorf("the bootstrap blob of %s appears in the plan", m.ID)
		}
	}

	if c.update {
		c.write(t, text.Bytes(), gotJSON)
	} else {
		if diff := cmp.Diff(string(c.section(t, secText)), text.String()); diff != "" {
			t.Errorf("%s: plan.txt differs (-want +got); run `go test ./golden -update` if the change is intended:\n%s", c.path, diff)
		}
		if diff := cmp.Diff(string(c.section(t, secJSON)), string(gotJSON)); diff != "" {
			t.Errorf("%s: plan.json differs (-want +got); run `go test ./golden -update` if the change is intended:\n%s", c.path, diff)
		}
	}

	c.converge(t, hv, clk, plan)
}

// converge applies the plan to the simulator the way the reconciler
// does, re-observes and re-plans until the plan is empty or maxRounds.
func (c *goldenCase) converge(t *testing.T, hv World, clk *clock, plan *planner.Plan) {
	if c.cfg.Bug != "" {
		t.Logf("BUG (known, expected to fail until fixed): %s", c.cfg.Bug)
	}
	foreign := foreignVMs(c.observe(t, hv, clk.Now(), false), c.cfg.Installation)
	doc := c.document(t, clk)
	exec := executor.New(executor.Options{Hypervisor: hv, Identity: c.plugin.Observation().Identity, Installation: c.cfg.Installation, Blob: doc.Blob,
		MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	// The plan is applied exactly as the reconciler applies it.
	rec := reconciler.New(reconciler.Options{Doc: doc, Hypervisor: hv, Executor: exec, Planner: c.plannerConfig(t),
		Capacity: desired.OnDemand, Now: clk.Now, Types: func(name string) (int, int, bool) {
			ty, ok := c.cfg.Types[name]
			return ty.VCPU, ty.MemoryMiB, ok
		}})
	var snap *observed.Snapshot
	rounds := 0
	for ; rounds < maxRounds && !empty(plan); rounds++ {
		for _, ch := range plan.Changes {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if out := rec.Apply(ctx, doc.Get(ch.Machine), ch); out == reconciler.OutcomeError || out == reconciler.OutcomeInterrupted {
				t.Fatalf("applying the change of %s: %s", ch.Machine, out)
			}
			cancel()
		}
		clk.Add(time.Second)
		snap = c.observe(t, hv, clk.Now(), false)
		plan = c.build(t, doc.All(), snap, clk.Now())
	}
	want := c.cfg.ExpectConverged == nil || *c.cfg.ExpectConverged
	final, _ := planner.MarshalJSON(plan)
	switch {
	case want && !empty(plan):
		var txt bytes.Buffer
		jsonplan.RenderText(&txt, final, jsonplan.TextOptions{})
		t.Errorf("no convergence after %d rounds of apply/observe/re-plan; the last plan is:\n%s", rounds, txt.String())
	case !want && empty(plan):
		t.Errorf("the case is marked expect-converged: false (%s), but it converged after %d rounds: drop the mark", c.cfg.Reason, rounds)
	}
	// Foreign VMs are never touched.
	if snap != nil {
		after := foreignVMs(snap, c.cfg.Installation)
		for ref, power := range foreign {
			if p, ok := after[ref]; ok && p != power {
				t.Errorf("foreign VM %s changed power from %s to %s", ref, power, p)
			} else if !ok && snap.Zones[strings.Split(ref, "/")[0]].Status == observed.StatusOK {
				t.Errorf("foreign VM %s disappeared", ref)
			}
		}
	}
	if !want || snap == nil {
		return
	}
	// Every settled machine's host reference names an owned VM.
	ix := observed.NewIndex(snap, c.cfg.Installation)
	for _, m := range doc.All() {
		if (m.State != desired.Idle && m.State != desired.Configured) || m.Host == "" {
			continue
		}
		found := false
		var refs []string
		first, more := ix.Owned(m.ID)
		if first == nil {
			continue
		}
		for _, vm := range append([]*observed.VM{first}, more...) {
			refs = append(refs, vm.Ref())
			found = found || vm.Ref() == m.Host
		}
		if !found {
			t.Errorf("after convergence machine %s is %s with host %s, but its owned VMs are %v", m.ID, m.State, m.Host, refs)
		}
	}
}

// foreignVMs maps the ref of every VM without this installation's marker
// (templates excluded) to its power state.
func foreignVMs(s *observed.Snapshot, installation string) map[string]observed.Power {
	out := map[string]observed.Power{}
	for _, z := range s.Zones {
		for _, vm := range z.VMs {
			if !vm.Owned(installation) && !vm.Template {
				out[vm.Ref()] = vm.Power
			}
		}
	}
	return out
}

// empty is the convergence test: nothing to do, nothing to wait for,
// nothing to report.
func empty(p *planner.Plan) bool { return len(p.Changes) == 0 && len(p.Drift) == 0 }

// document builds the desired document of desired.yaml in a memory
// store. A CONFIGURING machine is loaded IDLE and then configured through
// Mutate, because Open fails every Configure it finds (its blob is never
// stored), exactly as after a restart.
func (c *goldenCase) document(t *testing.T, clk *clock) *desired.Document {
	t.Helper()
	ctx := context.Background()
	machines := c.machines(t)
	state := map[string][]byte{}
	var slots []desired.Slot
	maxOp := 0
	type configure struct {
		id, cluster, blob string
	}
	var configures []configure
	for i, m := range machines {
		for _, r := range m.Ops {
			if n, err := strconv.Atoi(strings.TrimPrefix(r.ID, "op-")); err == nil && n > maxOp {
				maxOp = n
			}
		}
		if m.State == desired.Configuring {
			y := c.byID[m.ID]
			configures = append(configures, configure{m.ID, m.Cluster, y.Blob})
			cp := *m
			cp.State, cp.Intent, cp.Cluster = desired.Idle, nil, ""
			cp.Ops = map[desired.Kind]desired.OpRecord{desired.KindCreate: m.Ops[desired.KindCreate]}
			m = &cp
		}
		m.Rev = uint64(i + 1)
		raw, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		state["m/"+m.ID] = raw
		if !m.Slotless {
			slots = append(slots, desired.Slot{ID: m.ID, Zone: m.Zone, InstanceType: m.InstanceType, Capacity: m.Capacity,
				VCPU: m.VCPU, MemoryMiB: m.MemoryMiB, Source: m.Source})
		}
	}
	meta, _ := json.Marshal(map[string]any{"version": 1, "lineage": "golden", "installation": c.cfg.Installation,
		"next_op": maxOp, "rev": len(machines)})
	state["meta/doc"] = meta
	bareMetal := len(machines) > 0
	for _, m := range machines {
		bareMetal = bareMetal && m.Capacity == desired.BareMetal
	}
	doc, _, err := desired.Open(ctx, desired.Options{Store: desired.NewMemoryStore(state), Installation: c.cfg.Installation, VMName: naming.VMName,
		DeleteSupported: !bareMetal, Now: clk.Now}, slots)
	if err != nil {
		t.Fatalf("open desired document: %v", err)
	}
	for _, cf := range configures {
		if _, err := doc.Mutate(ctx, desired.Request{Kind: desired.KindConfigure, MachineID: cf.id, Cluster: cf.cluster,
			Blob: []byte(cf.blob)}); err != nil {
			t.Fatalf("configure %s: %v", cf.id, err)
		}
	}
	return doc
}

// write rewrites the expected sections (-update).
func (c *goldenCase) write(t *testing.T, text, js []byte) {
	t.Helper()
	var files []txtar.File
	for _, f := range c.archive.Files {
		if f.Name != secText && f.Name != secJSON {
			files = append(files, f)
		}
	}
	files = append(files, txtar.File{Name: secText, Data: text}, txtar.File{Name: secJSON, Data: js})
	c.archive.Files = files
	if err := os.WriteFile(c.path, txtar.Format(c.archive), 0o644); err != nil {
		t.Fatal(err)
	}
}
