package proxmoxsim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvemarker"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvespec"
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/retry"
)

// taskUser is the user every simulated task runs as.
const taskUser = "bigfleet@pve"

// Proxmox simulates a Proxmox VE cluster (one node per zone) with a
// cluster-wide VMID space, templates, clone/start/stop/destroy tasks and
// per-VM config locks, behind hypervisors.Hypervisor and
// pvespec.Steps.
type Proxmox struct {
	simcore.Surface // the calls every simulator answers alike
	c               *simcore.Core
	opts            Options

	zones   []string
	vms     map[int]*pveVM
	history []*task
	nextPID int
}

var (
	_ hypervisors.Hypervisor     = (*Proxmox)(nil)
	_ pvespec.Steps              = (*Proxmox)(nil)
	_ hypervisors.HealthReporter = (*Proxmox)(nil)
	_ hypervisors.CapacityReader = (*Proxmox)(nil)
	_ hypervisors.Simulator      = (*Proxmox)(nil)
)

const (
	// DefaultTemplateVMID is the template NewProxmox places on the first
	// zone when Options.TemplateVMID is zero.
	DefaultTemplateVMID = 9000
	// DefaultTemplateVCPU and DefaultTemplateMemory size a template whose
	// Options (or Template) leave it zero.
	DefaultTemplateVCPU   = 2
	DefaultTemplateMemory = 2048
	// FirstVMID is the lowest VMID the simulator allocates.
	FirstVMID = 100
)

// Options configure a simulated cluster: the settings every simulator
// shares (simcore.Options, embedded) and the cluster's own. The zero value
// is usable.
type Options struct {
	simcore.Options

	// TemplateVMID is the template on the first zone (default
	// DefaultTemplateVMID), Templates the extra templates, and
	// TemplateVCPU and TemplateMemory (MiB) the size of a template that
	// does not set its own (default 2 vCPU, 2048 MiB).
	TemplateVMID   int
	Templates      []Template
	TemplateVCPU   int
	TemplateMemory int
}

// Template is an extra template VM placed at construction; an empty Zone
// is the first zone.
type Template struct {
	VMID      int    `json:"vmid"`
	Zone      string `json:"zone"`
	Name      string `json:"name"`
	VCPU      int    `json:"vcpu,omitempty"`
	MemoryMiB int    `json:"memory_mib,omitempty"`
}

type pveVM struct {
	VMID        int      `json:"vmid"`
	Node        string   `json:"node"`
	Name        string   `json:"name"`
	Template    bool     `json:"template,omitempty"`
	Cores       int      `json:"cores"`
	MemoryMiB   int      `json:"memory_mib"`
	Tags        []string `json:"tags,omitempty"`
	Description string   `json:"description,omitempty"`
	OnBoot      bool     `json:"onboot,omitempty"`
	Pool        string   `json:"pool,omitempty"`
	// Lock is the config lock held by a running task ("clone", "destroy",
	// ...) or set out of band. Tasks do not survive a reload, so neither
	// do their locks.
	Lock string `json:"-"`
	simcore.Machine
}

// Task is a Proxmox task as the simulator records it.
type Task struct {
	UPID  string
	Node  string
	Type  string // qmclone, qmstart, qmresume, qmshutdown, qmstop, qmdestroy
	VMID  int
	Start time.Time
	End   time.Time
	// Status is "running", "OK", or the error the task failed with.
	Status string
}

type task struct {
	Task
	err  error
	done chan struct{}
}

// NewProxmox returns a fresh simulated cluster: the nodes opts.Zones, the
// template opts.TemplateVMID on the first node, opts.Templates, and no
// other VMs. With opts.Store every change is journaled there.
func NewProxmox(opts Options) *Proxmox {
	opts = withDefaults(opts)
	f := newProxmox(opts)
	f.vms[opts.TemplateVMID] = &pveVM{
		VMID: opts.TemplateVMID, Node: opts.Zones[0], Name: "bigfleet-template", Template: true,
		Cores: opts.TemplateVCPU, MemoryMiB: opts.TemplateMemory,
		Machine: simcore.Machine{Power: observed.PowerStopped},
	}
	for _, t := range opts.Templates {
		zone := t.Zone
		if zone == "" {
			zone = opts.Zones[0]
		}
		f.vms[t.VMID] = &pveVM{
			VMID: t.VMID, Node: zone, Name: t.Name, Template: true,
			Cores: cmpOr(t.VCPU, opts.TemplateVCPU), MemoryMiB: cmpOr(t.MemoryMiB, opts.TemplateMemory),
			Machine: simcore.Machine{Power: observed.PowerStopped},
		}
	}
	return f
}

// withDefaults applies the shared defaults and the cluster's own.
func withDefaults(o Options) Options {
	o.Options = o.Options.WithDefaults()
	o.TemplateVMID = cmpOr(o.TemplateVMID, DefaultTemplateVMID)
	o.TemplateVCPU = cmpOr(o.TemplateVCPU, DefaultTemplateVCPU)
	o.TemplateMemory = cmpOr(o.TemplateMemory, DefaultTemplateMemory)
	return o
}

func cmpOr(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

func newProxmox(opts Options) *Proxmox {
	f := &Proxmox{opts: opts, zones: opts.Zones, vms: map[int]*pveVM{}, nextPID: 0x1000}
	f.c = simcore.New(opts.Options, simcore.Machines{Find: f.machineOf, Save: f.saveMachine})
	f.Surface = simcore.NewSurface(f.c, &f.zones)
	return f
}

// OpenProxmox is NewProxmox plus the VMs persisted in opts.State (nodes
// only the state knows are added). With opts.ReadOnly every mutating call
// fails with ErrPermission (provider plan offline).
func OpenProxmox(opts Options) (*Proxmox, error) {
	f := NewProxmox(opts)
	var nodes []string
	err := f.c.Persisted(keyVM, func(key string, raw []byte) error {
		v := &pveVM{}
		if err := json.Unmarshal(raw, v); err != nil || strconv.Itoa(v.VMID) != strings.TrimPrefix(key, keyVM) {
			return fmt.Errorf("bad VM record: %v", err)
		}
		f.vms[v.VMID] = v
		nodes = append(nodes, v.Node)
		return nil
	})
	if err != nil {
		return nil, err
	}
	f.zones = simcore.MergeZones(f.zones, nodes)
	return f, nil
}

// keyVM prefixes the journaled VMs, one per VMID.
const keyVM = "px/vm/"

// saveVM journals a VM as it is now (or its removal). Callers hold the world lock.
func (f *Proxmox) saveVM(vmid int) {
	f.c.Persist(keyVM+strconv.Itoa(vmid), f.vms[vmid])
}

// Apply performs one Proxmox step.
func (f *Proxmox) Apply(ctx context.Context, t hypervisors.Target, p hypervisors.StepParams) (int, error) {
	return pvespec.Apply(ctx, f, t, p)
}

// AddForeign implements hypervisors.Simulator: it places a VM this
// installation does not own, with VMID t.VMID (0 allocates one).
func (f *Proxmox) AddForeign(t hypervisors.Target) error {
	_, err := f.AddForeignVM(t.Zone, t.VMID, t.Name, nil)
	return err
}

// AddOwned implements hypervisors.Simulator: it places a running VM named
// t.Name that carries m.
func (f *Proxmox) AddOwned(t hypervisors.Target, m observed.Marker) error {
	_, err := f.AddOwnedVM(t.Zone, t.Name, m, observed.PowerRunning)
	return err
}

// Tasks returns every task started since construction, oldest first.
func (f *Proxmox) Tasks() []Task {
	f.c.Lock()
	defer f.c.Unlock()
	out := make([]Task, len(f.history))
	for i, t := range f.history {
		out[i] = t.Task
	}
	return out
}

func (f *Proxmox) node(zone string) error {
	if !slices.Contains(f.zones, zone) {
		return fmt.Errorf("unknown proxmox node %q: %w", zone, hypervisors.ErrInvalid)
	}
	return nil
}

// vm resolves a target; the caller holds the world lock.
func (f *Proxmox) vm(t hypervisors.Target) (*pveVM, error) {
	if err := f.node(t.Zone); err != nil {
		return nil, err
	}
	v := f.vms[t.VMID]
	if v == nil || v.Node != t.Zone {
		return nil, fmt.Errorf("configuration file 'nodes/%s/qemu-server/%d.conf' does not exist: %w", t.Zone, t.VMID, hypervisors.ErrNotFound)
	}
	return v, nil
}

// unlocked fails with ErrLocked while a task or an operator holds the
// VM's config lock.
func (v *pveVM) unlocked() error {
	if v.Lock != "" {
		return fmt.Errorf("VM %d is locked (%s): %w", v.VMID, v.Lock, hypervisors.ErrLocked)
	}
	return nil
}

func (f *Proxmox) machineOf(t hypervisors.Target) (*simcore.Machine, *observed.Marker, error) {
	v, err := f.vm(t)
	if err != nil {
		return nil, nil, err
	}
	return &v.Machine, pvemarker.ParseDescription(v.Description), nil
}

func (v *pveVM) observe() *observed.VM {
	vm := &observed.VM{
		Zone: v.Node, Name: v.Name, VMID: v.VMID, Power: v.Power,
		VCPU: v.Cores, MemoryMiB: v.MemoryMiB, Template: v.Template,
		Autostart: v.OnBoot,
	}
	if m := pvemarker.ParseDescription(v.Description); m != nil && pvemarker.HasOwnershipTags(v.Tags, m.Installation) {
		vm.Marker = m
	}
	return vm
}

// Observe lists a node's VMs, templates included, sorted by VMID. The
// marker is read from the description and kept only when the tags carry
// the ownership tags of the installation it names.
func (f *Proxmox) Observe(ctx context.Context, zone string) (*observed.Zone, error) {
	if err := f.c.Enter(ctx, "Observe", zone, hypervisors.Target{Zone: zone}); err != nil {
		return nil, err
	}
	f.c.Lock()
	defer f.c.Unlock()
	if err := f.node(zone); err != nil {
		return nil, fmt.Errorf("observe %s: %w", zone, err)
	}
	z := &observed.Zone{Name: zone, Status: observed.StatusOK, At: f.c.Now()}
	for _, v := range f.vms {
		if v.Node == zone {
			z.VMs = append(z.VMs, v.observe())
		}
	}
	sort.Slice(z.VMs, func(i, j int) bool { return z.VMs[i].VMID < z.VMs[j].VMID })
	return z, nil
}

// Lookup re-reads one VM by VMID on the target's node.
func (f *Proxmox) Lookup(ctx context.Context, t hypervisors.Target) (*observed.VM, error) {
	if err := f.c.Enter(ctx, "Lookup", t.Zone, t); err != nil {
		return nil, err
	}
	f.c.Lock()
	defer f.c.Unlock()
	v, err := f.vm(t)
	if err != nil {
		return nil, fmt.Errorf("lookup: %w", err)
	}
	return v.observe(), nil
}

// startTask starts a task that runs for d and then, under the lock, calls
// finish with the hook's verdict; finish's result is the task's. While it
// runs, v (if any) holds the config lock. The caller holds the world lock.
func (f *Proxmox) startTask(node, typ string, vmid int, v *pveVM, lock string, d time.Duration, finish func(failed error) error) *task {
	f.nextPID++
	start := f.c.Now()
	t := &task{
		Task: Task{
			UPID: fmt.Sprintf("UPID:%s:%08X:%08X:%08X:%s:%d:%s:", node, f.nextPID, f.nextPID*16, start.Unix(), typ, vmid, taskUser),
			Node: node, Type: typ, VMID: vmid, Start: start, Status: "running",
		},
		done: make(chan struct{}),
	}
	f.history = append(f.history, t)
	if f.c.Closed() {
		// Close is waiting for tasks (or done): start no new ones.
		t.err = fmt.Errorf("fake hypervisor closed: %w", hypervisors.ErrUnreachable)
		t.End, t.Status = start, t.err.Error()
		close(t.done)
		return t
	}
	if v != nil {
		v.Lock = lock
	}
	f.c.Background(func() {
		defer close(t.done)
		time.Sleep(d)
		var failed error
		if h := f.c.CurrentHook(); h != nil {
			failed = h(context.Background(), simcore.Call{Op: "task/" + typ, Zone: node, Target: hypervisors.Target{Zone: node, VMID: vmid}})
		}
		f.c.Lock()
		defer f.c.Unlock()
		err := finish(failed)
		if v != nil && v.Lock == lock {
			v.Lock = ""
		}
		t.End = f.c.Now()
		t.Status = "OK"
		if err != nil {
			t.Status = err.Error()
			t.err = err
		}
		f.saveVM(vmid)
	})
	return t
}

// wait waits for a task; ctx ending stops the wait, not the task.
func (t *task) wait(ctx context.Context) error {
	select {
	case <-t.done:
		if t.err != nil {
			return fmt.Errorf("task %s failed: %w", t.UPID, t.err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for task %s: %w", t.UPID, ctx.Err())
	}
}

// adoptable returns the VMID of the VM whose description marker names
// the same installation and machine, or 0. The caller holds the world lock.
func (f *Proxmox) adoptable(zone string, m observed.Marker) (int, error) {
	ids := make([]int, 0, len(f.vms))
	for id := range f.vms {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	for _, id := range ids {
		v := f.vms[id]
		if v.Template || !simcore.SameOwner(pvemarker.ParseDescription(v.Description), &m) {
			continue
		}
		if v.Node != zone {
			return 0, fmt.Errorf("machine %s already has VM %d on node %s: %w", m.MachineID, id, v.Node, hypervisors.ErrExists)
		}
		if err := v.unlocked(); err != nil {
			return 0, err
		}
		return id, nil
	}
	return 0, nil
}

func (f *Proxmox) freeVMID() int {
	id := FirstVMID
	for f.vms[id] != nil {
		id++
	}
	return id
}

// CloneVM full-clones a template onto zone and returns the new VMID, or
// adopts and returns the VM whose description already names this
// installation and machine. The VMID is allocated like /cluster/nextid:
// read, then claimed one round trip later, retrying when a concurrent
// clone claimed it first. The clone carries the marker in its description
// and tags, and holds the "clone" lock until its task ends.
func (f *Proxmox) CloneVM(ctx context.Context, zone string, spec pvespec.CloneSpec) (int, error) {
	if err := f.c.EnterWrite(ctx, "CloneVM", zone, hypervisors.Target{Zone: zone, Name: spec.Name}); err != nil {
		return 0, err
	}
	if err := f.c.CreateFault("clone "+spec.Name, spec.Labels); err != nil {
		return 0, err
	}
	if spec.Name == "" || spec.Marker.Installation == "" || spec.Marker.MachineID == "" {
		return 0, fmt.Errorf("clone %q on %s: name and marker are required: %w", spec.Name, zone, hypervisors.ErrInvalid)
	}
	tmplID := cmpOr(spec.TemplateVMID, f.opts.TemplateVMID)
	wrap := func(err error) error { return fmt.Errorf("clone %s on %s: %w", spec.Name, zone, err) }

	// check returns a VMID to adopt, or the first free VMID as candidate.
	check := func() (adopt, candidate int, err error) {
		if err := f.node(zone); err != nil {
			return 0, 0, err
		}
		if id, err := f.adoptable(zone, spec.Marker); id != 0 || err != nil {
			return id, 0, err
		}
		tmpl := f.vms[tmplID]
		switch {
		case tmpl == nil:
			return 0, 0, fmt.Errorf("template %d does not exist: %w", tmplID, hypervisors.ErrNotFound)
		case !tmpl.Template:
			return 0, 0, fmt.Errorf("VM %d is not a template: %w", tmplID, hypervisors.ErrInvalid)
		}
		return 0, f.freeVMID(), nil
	}

	id, err := retry.Value(ctx, retry.VMIDCollision, func(err error) bool { return errors.Is(err, errVMIDTaken) }, func(ctx context.Context) (int, error) {
		f.c.Lock()
		adopt, candidate, err := check()
		f.c.Unlock()
		if adopt != 0 || err != nil {
			return adopt, wrapIf(err, wrap)
		}
		// The clone request travels with newid=candidate.
		if err := simcore.Sleep(ctx, f.opts.Latency); err != nil {
			return 0, wrap(err)
		}
		f.c.Lock()
		adopt, _, err = check()
		if adopt != 0 || err != nil {
			f.c.Unlock()
			return adopt, wrapIf(err, wrap)
		}
		if f.vms[candidate] != nil {
			f.c.Unlock()
			return 0, errVMIDTaken // VM <candidate> already exists: allocate again.
		}
		tmpl := f.vms[tmplID]
		tags := pvemarker.Tags(spec.Marker)
		sort.Strings(tags)
		v := &pveVM{
			VMID: candidate, Node: zone, Name: spec.Name, Cores: tmpl.Cores, MemoryMiB: tmpl.MemoryMiB,
			Tags: tags, Description: pvemarker.Description(spec.Marker), Pool: spec.Pool,
			Machine: simcore.Machine{Power: observed.PowerStopped},
		}
		f.vms[candidate] = v
		t := f.startTask(zone, "qmclone", candidate, v, "clone", f.opts.Latency, func(failed error) error {
			if failed != nil && f.vms[candidate] == v {
				delete(f.vms, candidate)
			}
			return failed
		})
		f.saveVM(candidate)
		f.c.Unlock()
		if err := t.wait(ctx); err != nil {
			return 0, wrap(err)
		}
		return candidate, nil
	})
	if errors.Is(err, errVMIDTaken) {
		return 0, wrap(fmt.Errorf("no free VMID after %d attempts: %w", retry.VMIDCollision.Attempts, hypervisors.ErrTransient))
	}
	if err != nil && retry.Last(err) != nil {
		return 0, wrap(err)
	}
	return id, err
}

// errVMIDTaken is a clone whose VMID was taken meanwhile: it is tried
// again with another (retry.VMIDCollision).
var errVMIDTaken = errors.New("vmid taken")

func wrapIf(err error, wrap func(error) error) error {
	if err == nil {
		return nil
	}
	return wrap(err)
}

// ConfigureVM sets cores, memory, onboot, tags and description. It
// refuses a VM whose description does not name the same installation and
// machine (ErrNotOwned), a template (ErrInvalid) and a locked VM
// (ErrLocked).
func (f *Proxmox) ConfigureVM(ctx context.Context, t hypervisors.Target, spec pvespec.SizeSpec) error {
	if err := f.c.EnterWrite(ctx, "ConfigureVM", t.Zone, t); err != nil {
		return err
	}
	if spec.VCPU <= 0 || spec.MemoryMiB <= 0 {
		return fmt.Errorf("configure %s: vcpu and memory must be positive: %w", simcore.TargetName(t), hypervisors.ErrInvalid)
	}
	f.c.Lock()
	defer f.c.Unlock()
	v, err := f.owned(t, spec.Marker)
	if err != nil {
		return fmt.Errorf("configure: %w", err)
	}
	v.Cores, v.MemoryMiB, v.OnBoot = spec.VCPU, spec.MemoryMiB, spec.OnBoot
	v.setMarker(spec.Marker)
	f.saveVM(v.VMID)
	return nil
}

// owned resolves a target that may be reconfigured for marker m; the
// caller holds mu.
func (f *Proxmox) owned(t hypervisors.Target, m observed.Marker) (*pveVM, error) {
	v, err := f.vm(t)
	if err != nil {
		return nil, err
	}
	if v.Template {
		return nil, fmt.Errorf("VM %d is a template: %w", v.VMID, hypervisors.ErrInvalid)
	}
	if err := v.unlocked(); err != nil {
		return nil, err
	}
	if !simcore.SameOwner(pvemarker.ParseDescription(v.Description), &m) {
		return nil, fmt.Errorf("VM %d: %w", v.VMID, hypervisors.ErrNotOwned)
	}
	return v, nil
}

func (v *pveVM) setMarker(m observed.Marker) {
	v.Tags = pvemarker.Tags(m)
	sort.Strings(v.Tags)
	v.Description = pvemarker.Description(m)
}

// DeleteVM destroys a stopped VM and its disks (purge). A missing VM is
// success; a running or paused one is ErrInvalid, a locked one ErrLocked.
func (f *Proxmox) DeleteVM(ctx context.Context, t hypervisors.Target) error {
	if err := f.c.EnterWrite(ctx, "DeleteVM", t.Zone, t); err != nil {
		return err
	}
	f.c.Lock()
	v, err := f.vm(t)
	if errors.Is(err, hypervisors.ErrNotFound) {
		f.c.Unlock()
		return nil
	}
	if err == nil && v.Template {
		err = fmt.Errorf("VM %d is a template: %w", v.VMID, hypervisors.ErrInvalid)
	}
	if err == nil {
		err = v.unlocked()
	}
	if err == nil && (v.Power == observed.PowerRunning || v.Power == observed.PowerPaused) {
		err = fmt.Errorf("VM %d is %s - destroy failed: %w", v.VMID, v.Power, hypervisors.ErrInvalid)
	}
	if err != nil {
		f.c.Unlock()
		return fmt.Errorf("delete: %w", err)
	}
	task := f.startTask(t.Zone, "qmdestroy", v.VMID, v, "destroy", f.opts.Latency, func(failed error) error {
		if failed == nil && f.vms[v.VMID] == v {
			delete(f.vms, v.VMID)
		}
		return failed
	})
	f.c.Unlock()
	if err := task.wait(ctx); err != nil {
		return fmt.Errorf("delete %s: %w", simcore.TargetName(t), err)
	}
	return nil
}

// power runs a power task on a VM after the common checks; the caller
// must not hold the world lock. plan decides, under the lock, which task (if any) to
// run and what it does at its end.
func (f *Proxmox) power(ctx context.Context, op string, t hypervisors.Target, missingOK bool,
	plan func(v *pveVM) (typ string, d time.Duration, finish func(v *pveVM), err error)) error {
	if err := f.c.EnterWrite(ctx, op, t.Zone, t); err != nil {
		return err
	}
	f.c.Lock()
	v, err := f.vm(t)
	if missingOK && errors.Is(err, hypervisors.ErrNotFound) {
		f.c.Unlock()
		return nil
	}
	if err == nil && v.Template {
		err = fmt.Errorf("VM %d is a template: %w", v.VMID, hypervisors.ErrInvalid)
	}
	var (
		typ    string
		d      time.Duration
		finish func(*pveVM)
	)
	if err == nil {
		typ, d, finish, err = plan(v)
	}
	if err == nil && typ != "" {
		err = v.unlocked()
	}
	if err != nil || typ == "" {
		f.c.Unlock()
		return wrapIf(err, func(err error) error { return fmt.Errorf("%s: %w", op, err) })
	}
	task := f.startTask(t.Zone, typ, v.VMID, v, typ, d, func(failed error) error {
		if failed == nil {
			finish(v)
		}
		return failed
	})
	f.c.Unlock()
	if err := task.wait(ctx); err != nil {
		return fmt.Errorf("%s %s: %w", op, simcore.TargetName(t), err)
	}
	return nil
}

// Start starts a VM (qmstart task; a paused VM gets qmresume, a running
// one nothing).
func (f *Proxmox) Start(ctx context.Context, t hypervisors.Target) error {
	return f.power(ctx, "Start", t, false, func(v *pveVM) (string, time.Duration, func(*pveVM), error) {
		switch v.Power {
		case observed.PowerRunning:
			return "", 0, nil, nil
		case observed.PowerPaused:
			return "qmresume", f.opts.Latency, func(v *pveVM) { v.PowerOn(f.c.Now()) }, nil
		}
		return "qmstart", f.opts.Latency, func(v *pveVM) { v.PowerOn(f.c.Now()) }, nil
	})
}

// Resume resumes a paused VM; a running one is left alone, a stopped one
// is ErrInvalid.
func (f *Proxmox) Resume(ctx context.Context, t hypervisors.Target) error {
	return f.power(ctx, "Resume", t, false, func(v *pveVM) (string, time.Duration, func(*pveVM), error) {
		switch v.Power {
		case observed.PowerRunning:
			return "", 0, nil, nil
		case observed.PowerPaused:
			return "qmresume", f.opts.Latency, func(v *pveVM) { v.PowerOn(f.c.Now()) }, nil
		}
		return "", 0, nil, fmt.Errorf("VM %d is %s: %w", v.VMID, v.Power, hypervisors.ErrInvalid)
	})
}

// Stop shuts a VM down (qmshutdown with forceStop after grace: a running
// guest obeys at once, a paused one only yields to the force stop). A
// stopped or missing VM is success; a crashed one gets qmstop.
func (f *Proxmox) Stop(ctx context.Context, t hypervisors.Target, grace time.Duration) error {
	return f.power(ctx, "Stop", t, true, func(v *pveVM) (string, time.Duration, func(*pveVM), error) {
		off := func(v *pveVM) { v.PowerOff(observed.PowerStopped) }
		switch v.Power {
		case observed.PowerStopped:
			return "", 0, nil, nil
		case observed.PowerCrashed:
			return "qmstop", f.opts.Latency, off, nil
		case observed.PowerPaused:
			return "qmshutdown", f.opts.Latency + grace, off, nil
		}
		return "qmshutdown", f.opts.Latency, off, nil
	})
}

// SetAutostart sets onboot.
func (f *Proxmox) SetAutostart(ctx context.Context, t hypervisors.Target, on bool) error {
	if err := f.c.EnterWrite(ctx, "SetAutostart", t.Zone, t); err != nil {
		return err
	}
	f.c.Lock()
	defer f.c.Unlock()
	v, err := f.vm(t)
	if err == nil {
		err = v.unlocked()
	}
	if err != nil {
		return fmt.Errorf("set onboot: %w", err)
	}
	if v.OnBoot != on {
		v.OnBoot = on
		f.saveVM(v.VMID)
	}
	return nil
}

// SetMarker rewrites tags and description; see ConfigureVM for refusals.
func (f *Proxmox) SetMarker(ctx context.Context, t hypervisors.Target, m observed.Marker) error {
	if err := f.c.EnterWrite(ctx, "SetMarker", t.Zone, t); err != nil {
		return err
	}
	f.c.Lock()
	defer f.c.Unlock()
	v, err := f.owned(t, m)
	if err != nil {
		return fmt.Errorf("set marker: %w", err)
	}
	v.setMarker(m)
	f.saveVM(v.VMID)
	return nil
}

// Out-of-band changes: what an operator or HA does behind the provider's
// back. They are not hypervisor calls (no latency, hook, count or
// reachability check) and ignore locks.

func (f *Proxmox) oob(t hypervisors.Target, change func(v *pveVM)) error {
	f.c.Lock()
	defer f.c.Unlock()
	v, err := f.vm(t)
	if err != nil {
		return err
	}
	id := v.VMID
	change(v)
	f.saveVM(id)
	return nil
}

// StopVM powers a VM off out of band.
func (f *Proxmox) StopVM(t hypervisors.Target) error {
	return f.oob(t, func(v *pveVM) { v.PowerOff(observed.PowerStopped) })
}

// CrashVM puts a VM into the crashed (internal-error) state out of band.
func (f *Proxmox) CrashVM(t hypervisors.Target) error {
	return f.oob(t, func(v *pveVM) { v.PowerOff(observed.PowerCrashed) })
}

// PauseVM suspends a running VM out of band.
func (f *Proxmox) PauseVM(t hypervisors.Target) error {
	return f.oob(t, func(v *pveVM) {
		if v.Power == observed.PowerRunning {
			v.Power = observed.PowerPaused
		}
	})
}

// ResizeVM changes a VM's cores and memory out of band.
func (f *Proxmox) ResizeVM(t hypervisors.Target, vcpu, memoryMiB int) error {
	if err := simcore.CheckSize(vcpu, memoryMiB); err != nil {
		return fmt.Errorf("resize VM %d: %w", t.VMID, err)
	}
	return f.oob(t, func(v *pveVM) { v.Cores, v.MemoryMiB = vcpu, memoryMiB })
}

// SetLock sets (or, with "", clears) a VM's config lock out of band, as a
// backup or an interrupted task would leave it.
func (f *Proxmox) SetLock(t hypervisors.Target, lock string) error {
	return f.oob(t, func(v *pveVM) { v.Lock = lock })
}

// RemoveVM purges a VM out of band, without any check.
func (f *Proxmox) RemoveVM(t hypervisors.Target) error {
	return f.oob(t, func(v *pveVM) { delete(f.vms, v.VMID) })
}

// AddOwnedVM places a VM as CloneVM and ConfigureVM would have left it
// (marker in tags and description, 2 cores, 2048 MiB, power as given) and
// returns its VMID.
func (f *Proxmox) AddOwnedVM(zone, name string, m observed.Marker, power observed.Power) (int, error) {
	return f.addVM(zone, 0, name, &m, power)
}

// AddForeignVM places a running VM that is not ours: no marker (m == nil)
// or another installation's or machine's marker. vmid 0 allocates one.
// It returns the VMID.
func (f *Proxmox) AddForeignVM(zone string, vmid int, name string, m *observed.Marker) (int, error) {
	return f.addVM(zone, vmid, name, m, observed.PowerRunning)
}

func (f *Proxmox) addVM(zone string, vmid int, name string, m *observed.Marker, power observed.Power) (int, error) {
	if err := errors.Join(checkVMID(vmid), simcore.CheckVMName(name), simcore.CheckMarker(m)); err != nil {
		return 0, fmt.Errorf("add a VM on %s: %w", zone, err)
	}
	f.c.Lock()
	defer f.c.Unlock()
	if err := f.node(zone); err != nil {
		return 0, err
	}
	if vmid == 0 {
		vmid = f.freeVMID()
	}
	if f.vms[vmid] != nil {
		return 0, fmt.Errorf("add VM %d: %w", vmid, hypervisors.ErrExists)
	}
	v := &pveVM{VMID: vmid, Node: zone, Name: name, Cores: 2, MemoryMiB: 2048, Machine: simcore.Machine{Power: observed.PowerStopped}}
	if m != nil {
		v.setMarker(*m)
	}
	switch power {
	case observed.PowerRunning:
		v.PowerOn(f.c.Now())
	case observed.PowerPaused:
		v.PowerOn(f.c.Now())
		v.Power = observed.PowerPaused
	case "":
	default:
		v.Power = power
	}
	f.vms[vmid] = v
	f.saveVM(vmid)
	return vmid, nil
}

func (f *Proxmox) saveMachine(t hypervisors.Target) {
	if v, err := f.vm(t); err == nil {
		f.saveVM(v.VMID)
	}
}

// checkVMID checks a Proxmox VMID; 0 asks the simulator to allocate one.
func checkVMID(vmid int) error {
	if vmid != 0 && (vmid < pvespec.MinVMID || vmid > pvespec.MaxVMID) {
		return simcore.Invalid(fmt.Errorf("vmid %d is outside the Proxmox VMID range %d..%d", vmid, pvespec.MinVMID, pvespec.MaxVMID))
	}
	return nil
}
