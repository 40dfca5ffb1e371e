package proxmox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	pxapi "github.com/luthermonson/go-proxmox"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvemarker"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvespec"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/retry"
)

// ourDescription reports whether a description carries this
// installation's marker (and, when machineID is set, that machine's).
func (a *Adapter) ourDescription(desc, machineID string) (*observed.Marker, bool) {
	m := pvemarker.ParseDescription(desc)
	if m == nil || m.Installation != a.cfg.Installation {
		return m, false
	}
	return m, machineID == "" || m.MachineID == machineID
}

// CloneVM full-clones spec.TemplateVMID onto zone and returns the new
// VMID, or adopts and returns the VM that already carries our marker for
// spec.Marker.MachineID.
func (a *Adapter) CloneVM(ctx context.Context, zone string, spec pvespec.CloneSpec) (int, error) {
	if err := a.checkZone(zone); err != nil {
		return 0, err
	}
	mid := spec.Marker.MachineID
	switch {
	case spec.Name == "" || spec.TemplateVMID <= 0 || mid == "":
		return 0, fmt.Errorf("clone on %s: name, template vmid and machine id are required: %w", zone, hypervisors.ErrInvalid)
	case spec.Marker.Installation != a.cfg.Installation:
		return 0, fmt.Errorf("clone %s on %s: marker names installation %q, not %q: %w", spec.Name, zone,
			spec.Marker.Installation, a.cfg.Installation, hypervisors.ErrInvalid)
	}
	log := a.log.With("op", "clone", "zone", zone, "machine", mid)
	l, err := a.list(ctx, true)
	if err != nil {
		return 0, fmt.Errorf("clone %s on %s: %w", spec.Name, zone, err)
	}
	rs := l.vms
	if id, ok, err := a.findOwnClone(ctx, rs, spec); err != nil {
		return 0, fmt.Errorf("clone %s on %s: adoption check: %w", spec.Name, zone, err)
	} else if ok {
		a.noteOwner(id, mid)
		log.Info("adopting existing clone", "vm", id)
		return id, nil
	}
	tnode := ""
	used := make(map[int]bool, len(rs))
	for _, r := range rs {
		used[int(r.VMID)] = true
		if int(r.VMID) == spec.TemplateVMID {
			if r.Template != 1 {
				return 0, fmt.Errorf("clone %s: vm %d is not a template: %w", spec.Name, spec.TemplateVMID, hypervisors.ErrInvalid)
			}
			tnode = r.Node
		}
	}
	if tnode == "" {
		return 0, fmt.Errorf("clone %s: template %d: %w", spec.Name, spec.TemplateVMID, hypervisors.ErrNotFound)
	}

	sem := a.cloneSem[zone]
	select {
	case sem <- struct{}{}:
		defer func() { <-sem }()
	case <-ctx.Done():
		return 0, fmt.Errorf("clone %s on %s: wait for a clone slot: %w", spec.Name, zone, ctxErr(ctx))
	}

	pool := spec.Pool
	if pool == "" {
		pool = a.cfg.Pool
	}
	opts := pxapi.VirtualMachineCloneOptions{
		Full: true, Name: spec.Name, Target: zone, Pool: pool, Storage: a.cfg.Storage,
		Description: pvemarker.Description(spec.Marker),
	}
	collisions := 0
	id, err := retry.Value(ctx, retry.VMIDCollision, func(err error) bool { return errors.Is(err, errVMIDTaken) }, func(ctx context.Context) (int, error) {
		id, err := a.reserve(ctx, used, mid)
		if err != nil {
			return 0, fmt.Errorf("clone %s on %s: allocate vmid: %w", spec.Name, zone, err)
		}
		err = a.cloneOnce(ctx, tnode, spec.TemplateVMID, id, opts)
		a.unreserve(id)
		a.invalidate(id)
		if err == nil {
			a.noteOwner(id, mid)
			log.Info("cloned", "vm", id, "template", spec.TemplateVMID)
			return id, nil
		}
		if !errors.Is(err, hypervisors.ErrExists) {
			if hypervisors.Retryable(err) {
				// PVE may still make this clone: the retry asks for the
				// same VMID.
				a.rememberLost(mid, id)
			}
			return 0, fmt.Errorf("clone %s on %s as %d: %w", spec.Name, zone, id, err)
		}
		used[id] = true
		// The id is taken: by a clone of ours whose answer we lost, or by
		// someone else (then try the next id).
		if ok, oerr := a.isOurClone(ctx, id, mid); oerr != nil {
			return 0, fmt.Errorf("clone %s on %s: check vm %d: %w", spec.Name, zone, id, oerr)
		} else if ok {
			a.noteOwner(id, mid)
			log.Info("adopting clone found on vmid collision", "vm", id)
			return id, nil
		}
		log.Debug("vmid taken, trying the next", "vm", id)
		collisions++
		return 0, errVMIDTaken
	})
	switch {
	case errors.Is(err, errVMIDTaken):
		return 0, fmt.Errorf("clone %s on %s: %d vmid collisions in a row: %w", spec.Name, zone, collisions, hypervisors.ErrExists)
	case err != nil && retry.Last(err) != nil:
		return 0, fmt.Errorf("clone %s on %s: after %d vmid collisions: %w", spec.Name, zone, collisions, err)
	}
	return id, err
}

// errVMIDTaken is a clone whose VMID someone else took meanwhile: the
// clone is tried again with another (retry.VMIDCollision).
var errVMIDTaken = errors.New("vmid taken")

func (a *Adapter) cloneOnce(ctx context.Context, tnode string, tvmid, newid int, opts pxapi.VirtualMachineCloneOptions) error {
	opts.NewID = newid
	tmpl := a.vmHandle(tnode, tvmid)
	// One request: a lost answer is transient, and the executor's next
	// CloneVM finds the clone by its marker and adopts it.
	_, task, err := tmpl.Clone(ctx, &opts)
	if err = classify(err); err != nil {
		return err
	}
	return a.waitTask(ctx, task, fmt.Sprintf("clone %d to %d", tvmid, newid))
}

// reserve hands out the VMID of the machine's last clone request whose
// answer was lost, if any, else the next VMID not used in the listing nor
// reserved by a clone in progress here, seeded once from /cluster/nextid.
func (a *Adapter) reserve(ctx context.Context, used map[int]bool, machineID string) (int, error) {
	a.allocMu.Lock()
	defer a.allocMu.Unlock()
	if id, ok := a.lost[machineID]; ok {
		delete(a.lost, machineID)
		if !a.inflight[id] {
			a.inflight[id] = true
			return id, nil
		}
	}
	if a.nextHint == 0 {
		cl := (&pxapi.Cluster{}).New(a.client)
		n, err := cl.NextID(ctx)
		if err = classify(err); err != nil {
			return 0, fmt.Errorf("nextid: %w", err)
		}
		a.nextHint = max(n, a.cfg.VMIDMin)
	}
	id := a.nextHint
	for used[id] || a.inflight[id] {
		id++
	}
	if id > a.cfg.VMIDMax {
		a.nextHint = 0
		return 0, fmt.Errorf("vmid range %d-%d exhausted: %w", a.cfg.VMIDMin, a.cfg.VMIDMax, hypervisors.ErrExists)
	}
	a.inflight[id] = true
	a.nextHint = id + 1
	return id, nil
}

func (a *Adapter) rememberLost(machineID string, id int) {
	a.allocMu.Lock()
	a.lost[machineID] = id
	a.allocMu.Unlock()
}

func (a *Adapter) unreserve(id int) {
	a.allocMu.Lock()
	delete(a.inflight, id)
	a.allocMu.Unlock()
}

// findOwnClone looks for a VM carrying our marker for the machine, by its
// deterministic name or machine tag, confirmed by the description marker.
func (a *Adapter) findOwnClone(ctx context.Context, rs []resource, spec pvespec.CloneSpec) (int, bool, error) {
	mtag := pvemarker.MachineTag(spec.Marker.MachineID)
	for _, r := range rs {
		if r.Template == 1 {
			continue
		}
		hasTag := false
		for _, t := range tagList(r.Tags) {
			hasTag = hasTag || t == mtag
		}
		if r.Name != spec.Name && !hasTag {
			continue
		}
		ok, err := a.isOurCloneOn(ctx, r.Node, int(r.VMID), spec.Marker.MachineID)
		if err != nil {
			return 0, false, err
		}
		if ok {
			return int(r.VMID), true, nil
		}
	}
	return 0, false, nil
}

// isOurClone finds the node of vmid and checks its marker.
func (a *Adapter) isOurClone(ctx context.Context, vmid int, machineID string) (bool, error) {
	l, err := a.list(ctx, true)
	if err != nil {
		return false, err
	}
	for _, r := range l.vms {
		if int(r.VMID) == vmid {
			return a.isOurCloneOn(ctx, r.Node, vmid, machineID)
		}
	}
	return false, nil
}

// isOurCloneOn reads a VM's config and reports whether it carries our
// marker for machineID; a clone still in progress is waited for (bounded
// by ctx), and one that vanished (failed clone) is not ours.
func (a *Adapter) isOurCloneOn(ctx context.Context, node string, vmid int, machineID string) (bool, error) {
	b := a.poll().Backoff()
	for {
		var cfg pxapi.VirtualMachineConfig
		err := classify(a.client.Get(ctx, fmt.Sprintf("/nodes/%s/qemu/%d/config", node, vmid), &cfg))
		if errors.Is(err, hypervisors.ErrNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if _, ok := a.ourDescription(cfg.Description, machineID); !ok {
			return false, nil
		}
		if cfg.Lock != "clone" {
			return true, nil
		}
		if err := sleep(ctx, b.Next()); err != nil {
			return false, fmt.Errorf("wait for clone %d to finish: %w", vmid, err)
		}
	}
}

// owned reads a VM and checks it carries this installation's marker (for
// machineID when set). A missing VM yields ErrNotFound.
func (a *Adapter) owned(ctx context.Context, t hypervisors.Target, machineID string) (*pxapi.VirtualMachine, error) {
	if err := a.checkZone(t.Zone); err != nil {
		return nil, err
	}
	v, err := a.readVM(ctx, t.Zone, t.VMID)
	if err != nil {
		return nil, err
	}
	if bool(v.Template) {
		return nil, fmt.Errorf("vm %d is a template: %w", t.VMID, hypervisors.ErrNotOwned)
	}
	if _, ok := a.ourDescription(v.VirtualMachineConfig.Description, machineID); !ok {
		return nil, fmt.Errorf("vm %d (%s) carries no marker of installation %q for this machine: %w",
			t.VMID, v.VirtualMachineConfig.Name, a.cfg.Installation, hypervisors.ErrNotOwned)
	}
	return v, nil
}

// ConfigureVM sizes a clone and (re)writes its tags, description and
// onboot; it is re-applied to adopted clones.
func (a *Adapter) ConfigureVM(ctx context.Context, t hypervisors.Target, spec pvespec.SizeSpec) error {
	if spec.VCPU <= 0 || spec.MemoryMiB <= 0 || spec.Marker.Installation != a.cfg.Installation {
		return fmt.Errorf("configure vm %d: vcpu, memory and a marker of this installation are required: %w", t.VMID, hypervisors.ErrInvalid)
	}
	v, err := a.owned(ctx, t, spec.Marker.MachineID)
	if err != nil {
		return fmt.Errorf("configure vm %d on %s: %w", t.VMID, t.Zone, err)
	}
	if v.VirtualMachineConfig.Lock != "" {
		return fmt.Errorf("configure vm %d on %s: vm is locked (%s): %w", t.VMID, t.Zone, v.VirtualMachineConfig.Lock, hypervisors.ErrLocked)
	}
	onboot := 0
	if spec.OnBoot {
		onboot = 1
	}
	err = classify(v.ConfigSync(ctx,
		pxapi.VirtualMachineOption{Name: "cores", Value: spec.VCPU},
		pxapi.VirtualMachineOption{Name: "memory", Value: spec.MemoryMiB},
		pxapi.VirtualMachineOption{Name: "tags", Value: strings.Join(pvemarker.Tags(spec.Marker), ";")},
		pxapi.VirtualMachineOption{Name: "description", Value: pvemarker.Description(spec.Marker)},
		pxapi.VirtualMachineOption{Name: "onboot", Value: onboot},
	))
	a.invalidate(t.VMID)
	a.noteOwner(t.VMID, spec.Marker.MachineID)
	if err != nil {
		return fmt.Errorf("configure vm %d on %s: %w", t.VMID, t.Zone, err)
	}
	return nil
}

// SetMarker rewrites the description marker and tags of an owned VM.
func (a *Adapter) SetMarker(ctx context.Context, t hypervisors.Target, m observed.Marker) error {
	if m.Installation != a.cfg.Installation || m.MachineID == "" {
		return fmt.Errorf("set marker on vm %d: marker must name this installation and a machine: %w", t.VMID, hypervisors.ErrInvalid)
	}
	v, err := a.owned(ctx, t, m.MachineID)
	if err != nil {
		return fmt.Errorf("set marker on vm %d: %w", t.VMID, err)
	}
	err = classify(v.ConfigSync(ctx,
		pxapi.VirtualMachineOption{Name: "tags", Value: strings.Join(pvemarker.Tags(m), ";")},
		pxapi.VirtualMachineOption{Name: "description", Value: pvemarker.Description(m)},
	))
	a.invalidate(t.VMID)
	a.noteOwner(t.VMID, m.MachineID)
	if err != nil {
		return fmt.Errorf("set marker on vm %d: %w", t.VMID, err)
	}
	return nil
}

// SetAutostart sets onboot on an owned VM.
func (a *Adapter) SetAutostart(ctx context.Context, t hypervisors.Target, on bool) error {
	v, err := a.owned(ctx, t, "")
	if err != nil {
		return fmt.Errorf("set onboot on vm %d: %w", t.VMID, err)
	}
	val := 0
	if on {
		val = 1
	}
	err = classify(v.ConfigSync(ctx, pxapi.VirtualMachineOption{Name: "onboot", Value: val}))
	a.invalidate(t.VMID)
	if err != nil {
		return fmt.Errorf("set onboot on vm %d: %w", t.VMID, err)
	}
	return nil
}

// Start powers a VM on; a paused VM is resumed; a running one is left.
func (a *Adapter) Start(ctx context.Context, t hypervisors.Target) error {
	if err := a.ensureRunning(ctx, t); err != nil {
		return fmt.Errorf("start vm %d on %s: %w", t.VMID, t.Zone, err)
	}
	return nil
}

// Resume resumes a paused VM (and starts a stopped one).
func (a *Adapter) Resume(ctx context.Context, t hypervisors.Target) error {
	if err := a.ensureRunning(ctx, t); err != nil {
		return fmt.Errorf("resume vm %d on %s: %w", t.VMID, t.Zone, err)
	}
	return nil
}

func (a *Adapter) ensureRunning(ctx context.Context, t hypervisors.Target) error {
	if err := a.checkZone(t.Zone); err != nil {
		return err
	}
	v, err := a.readVM(ctx, t.Zone, t.VMID)
	if err != nil {
		return err
	}
	if bool(v.Template) {
		return fmt.Errorf("vm %d is a template: %w", t.VMID, hypervisors.ErrInvalid)
	}
	var task *pxapi.Task
	switch {
	case v.IsPaused():
		task, err = v.Resume(ctx)
	case v.Status == pxapi.StatusVirtualMachineRunning:
		return nil
	default:
		task, err = v.Start(ctx)
	}
	a.invalidate(0)
	if err = classify(err); err != nil {
		return err
	}
	return a.waitTask(ctx, task, "power on")
}

// Stop shuts an owned VM down gracefully for at most grace, then powers
// it off. A stopped or missing VM is success.
func (a *Adapter) Stop(ctx context.Context, t hypervisors.Target, grace time.Duration) error {
	v, err := a.owned(ctx, t, "")
	if errors.Is(err, hypervisors.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stop vm %d on %s: %w", t.VMID, t.Zone, err)
	}
	if err := a.stop(ctx, v, grace); err != nil {
		return fmt.Errorf("stop vm %d on %s: %w", t.VMID, t.Zone, err)
	}
	return nil
}

func (a *Adapter) stop(ctx context.Context, v *pxapi.VirtualMachine, grace time.Duration) error {
	if v.Status == pxapi.StatusVirtualMachineStopped {
		return nil
	}
	defer a.invalidate(0)
	path := fmt.Sprintf("/nodes/%s/qemu/%d/status", v.Node, v.VMID)
	if grace > 0 && !v.IsPaused() {
		secs := int(math.Ceil(grace.Seconds()))
		var upid pxapi.UPID
		err := classify(a.client.Post(ctx, path+"/shutdown", map[string]any{"timeout": secs}, &upid))
		if err == nil {
			gctx, cancel := context.WithTimeout(ctx, grace+5*time.Second)
			err = a.waitTask(gctx, pxapi.NewTask(upid, a.client), "shutdown")
			cancel()
		}
		if err == nil {
			return nil
		}
		if errors.Is(err, hypervisors.ErrPermission) || ctx.Err() != nil {
			return err
		}
		a.log.Info("graceful shutdown failed, powering off", "vm", int(v.VMID), "err", err)
	}
	task, err := v.Stop(ctx)
	if err = classify(err); err != nil {
		return err
	}
	return a.waitTask(ctx, task, "power off")
}

// DeleteVM stops and destroys an owned VM with its disks and checks the
// VMID is gone. An already-gone VM is success.
func (a *Adapter) DeleteVM(ctx context.Context, t hypervisors.Target) error {
	v, err := a.owned(ctx, t, "")
	if errors.Is(err, hypervisors.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete vm %d on %s: %w", t.VMID, t.Zone, err)
	}
	defer a.invalidate(t.VMID)
	if err := a.stop(ctx, v, 0); err != nil {
		return fmt.Errorf("delete vm %d on %s: %w", t.VMID, t.Zone, err)
	}
	task, err := v.Delete(ctx, &pxapi.VirtualMachineDeleteOptions{Purge: true, DestroyUnreferencedDisks: true})
	err = classify(err)
	if errors.Is(err, hypervisors.ErrNotFound) {
		return nil
	}
	if err == nil {
		err = a.waitTask(ctx, task, "destroy")
	}
	if err != nil {
		return fmt.Errorf("delete vm %d on %s: %w", t.VMID, t.Zone, err)
	}
	if _, err := a.readVM(ctx, t.Zone, t.VMID); !errors.Is(err, hypervisors.ErrNotFound) {
		if err == nil {
			err = fmt.Errorf("vm still exists after destroy: %w", hypervisors.ErrTransient)
		}
		return fmt.Errorf("delete vm %d on %s: verify: %w", t.VMID, t.Zone, err)
	}
	return nil
}
