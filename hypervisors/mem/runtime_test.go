package mem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/guest"
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/retry"
)

// Step 3. The runtime: mem's own world over the shared simulator core.
//
// A mem host numbers its VMs: create allocates an id, and every call
// finds a VM by zone and id (Target.VMID), never by name; two VMs may
// share a name. The ownership marker is a field of the VM's record, read
// back as it was written. The world is journaled as one record per VM,
// "mem/vm/<id>". simcore supplies the rest: the world lock, call counts,
// hooks, latency, reachability, faults, the journal and each VM's
// simulated guest and agent.

// vm is one mem VM as the host keeps it.
type vm struct {
	ID        int              `json:"id"`
	Zone      string           `json:"zone"`
	Name      string           `json:"name"`
	VCPU      int              `json:"vcpu"`
	MemoryMiB int              `json:"memory_mib"`
	Autostart bool             `json:"autostart,omitempty"`
	Owner     *observed.Marker `json:"owner,omitempty"` // the ownership marker
	simcore.Machine
}

func (v *vm) observe() *observed.VM {
	return &observed.VM{Zone: v.Zone, Name: v.Name, VMID: v.ID, Power: v.Power, VCPU: v.VCPU, MemoryMiB: v.MemoryMiB,
		Autostart: v.Autostart, Marker: simcore.CloneMarker(v.Owner)}
}

// world is a mem installation: its zones (hosts) and their VMs.
type world struct {
	simcore.Surface // what every simulator answers alike: health, capacity, hooks...
	c               *simcore.Core
	zones           []string
	vms             map[int]*vm // by id, unique across zones; guarded by c's lock
}

var (
	_ hypervisors.Hypervisor     = (*world)(nil)
	_ hypervisors.HealthReporter = (*world)(nil)
	_ hypervisors.CapacityReader = (*world)(nil)
	_ hypervisors.Simulator      = (*world)(nil)
)

// keyVM prefixes the journaled VMs, one record per id.
const keyVM = "mem/vm/"

func newWorld(opts simcore.Options) *world {
	opts = opts.WithDefaults()
	w := &world{zones: opts.Zones, vms: map[int]*vm{}}
	w.c = simcore.New(opts, simcore.Machines{Find: w.machine, Save: w.saveTarget})
	w.Surface = simcore.NewSurface(w.c, &w.zones)
	return w
}

// openWorld is newWorld plus the VMs journaled in opts.State.
func openWorld(opts simcore.Options) (*world, error) {
	w := newWorld(opts)
	var zones []string
	err := w.c.Persisted(keyVM, func(key string, raw []byte) error {
		v := &vm{}
		if err := json.Unmarshal(raw, v); err != nil {
			return err
		}
		if key != keyVM+strconv.Itoa(v.ID) {
			return fmt.Errorf("the record of VM %d is under %s", v.ID, key)
		}
		w.vms[v.ID] = v
		zones = append(zones, v.Zone)
		return nil
	})
	w.zones = simcore.MergeZones(w.zones, zones)
	return w, err
}

// save journals VM id as it is now (nil: removed); the lock is held.
func (w *world) save(id int) { w.c.Persist(keyVM+strconv.Itoa(id), w.vms[id]) }

func (w *world) saveTarget(t hypervisors.Target) {
	if v, err := w.find(t); err == nil {
		w.save(v.ID)
	}
}

func (w *world) zone(z string) error {
	if !slices.Contains(w.zones, z) {
		return fmt.Errorf("unknown mem zone %q: %w", z, hypervisors.ErrInvalid)
	}
	return nil
}

// find resolves t by zone and id; the lock is held.
func (w *world) find(t hypervisors.Target) (*vm, error) {
	if err := w.zone(t.Zone); err != nil {
		return nil, err
	}
	if v := w.vms[t.VMID]; v != nil && v.Zone == t.Zone {
		return v, nil
	}
	return nil, fmt.Errorf("mem VM %s: %w", simcore.TargetName(t), hypervisors.ErrNotFound)
}

// machine is simcore.Machines.Find: how the core reaches a VM's guest.
func (w *world) machine(t hypervisors.Target) (*simcore.Machine, *observed.Marker, error) {
	v, err := w.find(t)
	if err != nil {
		return nil, nil, err
	}
	return &v.Machine, v.Owner, nil
}

// nextID is the id a new VM takes: one more than the highest in use.
func (w *world) nextID() int {
	if len(w.vms) == 0 {
		return 1
	}
	return slices.Max(slices.Collect(maps.Keys(w.vms))) + 1
}

// Observe lists a zone's VMs by id.
func (w *world) Observe(ctx context.Context, zone string) (*observed.Zone, error) {
	if err := w.c.Enter(ctx, "Observe", zone, hypervisors.Target{Zone: zone}); err != nil {
		return nil, err
	}
	w.c.Lock()
	defer w.c.Unlock()
	if err := w.zone(zone); err != nil {
		return nil, fmt.Errorf("observe: %w", err)
	}
	z := &observed.Zone{Name: zone, Status: observed.StatusOK, At: w.c.Now()}
	for _, id := range slices.Sorted(maps.Keys(w.vms)) {
		if v := w.vms[id]; v.Zone == zone {
			z.VMs = append(z.VMs, v.observe())
		}
	}
	return z, nil
}

func (w *world) Lookup(ctx context.Context, t hypervisors.Target) (*observed.VM, error) {
	if err := w.c.Enter(ctx, "Lookup", t.Zone, t); err != nil {
		return nil, err
	}
	w.c.Lock()
	defer w.c.Unlock()
	v, err := w.find(t)
	if err != nil {
		return nil, fmt.Errorf("lookup: %w", err)
	}
	return v.observe(), nil
}

// change runs one mutating call op on t's VM (a missing VM is success
// when missingOK) and journals it.
func (w *world) change(ctx context.Context, op string, t hypervisors.Target, missingOK bool, fn func(v *vm) error) error {
	if err := w.c.EnterWrite(ctx, op, t.Zone, t); err != nil {
		return err
	}
	w.c.Lock()
	defer w.c.Unlock()
	v, err := w.find(t)
	if missingOK && errors.Is(err, hypervisors.ErrNotFound) {
		return nil
	}
	if err == nil {
		err = fn(v)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", op, simcore.TargetName(t), err)
	}
	w.save(v.ID)
	return nil
}

func (w *world) Start(ctx context.Context, t hypervisors.Target) error {
	return w.change(ctx, "Start", t, false, func(v *vm) error { v.PowerOn(w.c.Now()); return nil })
}

func (w *world) Resume(ctx context.Context, t hypervisors.Target) error {
	return w.change(ctx, "Resume", t, false, func(v *vm) error {
		if v.Power != observed.PowerRunning && v.Power != observed.PowerPaused {
			return fmt.Errorf("VM is %s: %w", v.Power, hypervisors.ErrInvalid)
		}
		v.PowerOn(w.c.Now())
		return nil
	})
}

// Stop powers the VM off at once: a mem guest has nothing to flush.
func (w *world) Stop(ctx context.Context, t hypervisors.Target, _ time.Duration) error {
	return w.change(ctx, "Stop", t, true, func(v *vm) error {
		if v.Power != observed.PowerStopped {
			v.PowerOff(observed.PowerStopped)
		}
		return nil
	})
}

func (w *world) SetAutostart(ctx context.Context, t hypervisors.Target, on bool) error {
	return w.change(ctx, "SetAutostart", t, false, func(v *vm) error { v.Autostart = on; return nil })
}

// SetMarker rewrites the marker of a VM that already names the same
// installation and machine.
func (w *world) SetMarker(ctx context.Context, t hypervisors.Target, m observed.Marker) error {
	if err := simcore.CheckMarker(&m); err != nil {
		return fmt.Errorf("set marker on %s: %w", simcore.TargetName(t), err)
	}
	return w.change(ctx, "SetMarker", t, false, func(v *vm) error {
		if !simcore.SameOwner(v.Owner, &m) {
			return hypervisors.ErrNotOwned
		}
		v.Owner = &m
		return nil
	})
}

// Apply performs mem's own steps.
func (w *world) Apply(ctx context.Context, t hypervisors.Target, p hypervisors.StepParams) (int, error) {
	switch p := p.(type) {
	case *create:
		return w.create(ctx, t, p)
	case *destroy:
		return 0, w.change(ctx, "Destroy", t, true, func(v *vm) error { delete(w.vms, v.ID); return nil })
	}
	return 0, fmt.Errorf("%s on mem: %w", p.Info().Name, hypervisors.ErrUnsupported)
}

// create makes a stopped VM carrying p.Marker and returns its new id, or
// the id of the VM in t.Zone that already carries the same installation
// and machine (an ensure: a create repeated after a crash adopts it).
func (w *world) create(ctx context.Context, t hypervisors.Target, p *create) (int, error) {
	if err := w.c.EnterWrite(ctx, "Create", t.Zone, t); err != nil {
		return 0, err
	}
	if err := errors.Join(w.c.CreateFault("create "+p.Name, p.Labels), simcore.CheckVMName(p.Name),
		simcore.CheckSize(p.VCPU, p.MemoryMiB), simcore.CheckMarker(&p.Marker)); err != nil {
		return 0, fmt.Errorf("create %s on %s: %w", p.Name, t.Zone, err)
	}
	w.c.Lock()
	defer w.c.Unlock()
	if err := w.zone(t.Zone); err != nil {
		return 0, err
	}
	for _, id := range slices.Sorted(maps.Keys(w.vms)) {
		if v := w.vms[id]; simcore.SameOwner(v.Owner, &p.Marker) {
			if v.Zone != t.Zone {
				return 0, fmt.Errorf("machine %s already has VM %d on %s: %w", p.Marker.MachineID, id, v.Zone, hypervisors.ErrExists)
			}
			return id, nil
		}
	}
	mk := p.Marker
	v := &vm{ID: w.nextID(), Zone: t.Zone, Name: p.Name, VCPU: p.VCPU, MemoryMiB: p.MemoryMiB, Owner: &mk,
		Machine: simcore.Machine{Power: observed.PowerStopped}}
	w.vms[v.ID] = v
	w.save(v.ID)
	return v.ID, nil
}

// The guest agent: the at-most-once protocol of package guest, run over
// mem's own transport. A mem host's agent channel carries at most
// maxWrite bytes per message, so every file the provider writes (the
// bootstrap blob) goes in private parts joined in the guest; behind the
// transport is simcore's simulated guest.

// maxWrite is the most one message of mem's agent channel carries.
const maxWrite = 64 << 10

// transport is mem's agent channel: simcore's wire with a message size
// limit.
type transport struct{ guest.Transport }

func (transport) MaxWrite() int { return maxWrite }

// agent enters the agent method op on t and returns the protocol over
// mem's transport.
func (w *world) agent(ctx context.Context, op string, t hypervisors.Target, argv []string, write bool) (*guest.Agent, error) {
	if err := w.c.EnterAgent(ctx, op, t, argv, write); err != nil {
		return nil, err
	}
	return &guest.Agent{T: transport{w.c.Wire(t)}, Poll: retry.Policy{Initial: time.Millisecond, Max: 10 * time.Millisecond}}, nil
}

func (w *world) AgentPing(ctx context.Context, t hypervisors.Target) error {
	a, err := w.agent(ctx, "AgentPing", t, nil, false)
	if err != nil {
		return fmt.Errorf("agent ping: %w", err)
	}
	return a.Ping(ctx)
}

func (w *world) AgentExec(ctx context.Context, t hypervisors.Target, argv []string) (hypervisors.ExecResult, error) {
	if len(argv) == 0 {
		return hypervisors.ExecResult{}, fmt.Errorf("agent exec: empty argv: %w", hypervisors.ErrInvalid)
	}
	a, err := w.agent(ctx, "AgentExec", t, argv, true)
	if err != nil {
		return hypervisors.ExecResult{}, fmt.Errorf("agent exec %s: %w", argv[0], err)
	}
	return a.Exec(ctx, argv)
}

func (w *world) AgentWriteFile(ctx context.Context, t hypervisors.Target, path string, data []byte, mode os.FileMode) error {
	a, err := w.agent(ctx, "AgentWriteFile", t, nil, true)
	if err != nil {
		return fmt.Errorf("agent write %s: %w", path, err)
	}
	return a.WriteFile(ctx, path, data, mode)
}

func (w *world) AgentRemoveFile(ctx context.Context, t hypervisors.Target, path string) error {
	a, err := w.agent(ctx, "AgentRemoveFile", t, nil, true)
	if err != nil {
		return fmt.Errorf("agent remove %s: %w", path, err)
	}
	return a.RemoveFile(ctx, path)
}

// The optional parts: health, capacity, and the simulator's out-of-band
// changes (the admin endpoints, the golden runner).

// oob changes t's VM behind the provider's back: no hook, latency or count.
func (w *world) oob(t hypervisors.Target, fn func(v *vm)) error {
	w.c.Lock()
	defer w.c.Unlock()
	v, err := w.find(t)
	if err != nil {
		return err
	}
	id := v.ID
	fn(v)
	w.save(id)
	return nil
}

func (w *world) StopVM(t hypervisors.Target) error {
	return w.oob(t, func(v *vm) { v.PowerOff(observed.PowerStopped) })
}

func (w *world) PauseVM(t hypervisors.Target) error {
	return w.oob(t, func(v *vm) {
		if v.Power == observed.PowerRunning {
			v.Power = observed.PowerPaused
		}
	})
}

func (w *world) ResizeVM(t hypervisors.Target, vcpu, memoryMiB int) error {
	if err := simcore.CheckSize(vcpu, memoryMiB); err != nil {
		return fmt.Errorf("resize %s: %w", simcore.TargetName(t), err)
	}
	return w.oob(t, func(v *vm) { v.VCPU, v.MemoryMiB = vcpu, memoryMiB })
}

func (w *world) RemoveVM(t hypervisors.Target) error {
	return w.oob(t, func(v *vm) { delete(w.vms, v.ID) })
}

// AddForeign places a running VM without a marker, with id t.VMID (0:
// the next one).
func (w *world) AddForeign(t hypervisors.Target) error {
	_, err := w.addVM(t.Zone, t.VMID, t.Name, nil, observed.PowerRunning)
	return err
}

// AddOwned places a running VM that carries m.
func (w *world) AddOwned(t hypervisors.Target, m observed.Marker) error {
	_, err := w.addVM(t.Zone, 0, t.Name, &m, observed.PowerRunning)
	return err
}

// addVM places a VM of 2 vCPUs and 2048 MiB carrying m (nil: none) and
// returns its id.
func (w *world) addVM(zone string, id int, name string, m *observed.Marker, power observed.Power) (int, error) {
	if err := errors.Join(simcore.CheckVMName(name), simcore.CheckMarker(m)); err != nil {
		return 0, fmt.Errorf("add a VM on %s: %w", zone, err)
	}
	if id < 0 {
		return 0, fmt.Errorf("add a VM on %s: id %d: %w", zone, id, hypervisors.ErrInvalid)
	}
	w.c.Lock()
	defer w.c.Unlock()
	if err := w.zone(zone); err != nil {
		return 0, err
	}
	if id == 0 {
		id = w.nextID()
	}
	if w.vms[id] != nil {
		return 0, fmt.Errorf("add VM %d: %w", id, hypervisors.ErrExists)
	}
	v := &vm{ID: id, Zone: zone, Name: name, VCPU: 2, MemoryMiB: 2048, Owner: simcore.CloneMarker(m),
		Machine: simcore.Machine{Power: observed.PowerStopped}}
	switch power {
	case observed.PowerRunning, observed.PowerPaused:
		v.PowerOn(w.c.Now())
		v.Power = power
	case "":
	default:
		v.Power = power
	}
	w.vms[id] = v
	w.save(id)
	return id, nil
}
