package metrics

import (
	"context"
	"os"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/observed"
)

// Instrument wraps a hypervisor so every call is counted and timed by
// operation and outcome. It is one type whatever the adapter offers: its
// Capabilities are the adapter's, with the shape steps (when the adapter
// has them) replaced by counted ones, so hypervisors.Find reaches them
// through the wrapper; health, events and volume reads pass through
// uncounted; the adapter's RPC reports are subscribed to here, once.
func Instrument(hv hypervisors.Hypervisor, m *Metrics) hypervisors.Hypervisor {
	if m == nil {
		return hv
	}
	i := &instrumented{hv: hv, m: m, caps: hypervisors.CapabilitiesOf(hv)}
	if i.caps.RPCs != nil {
		i.caps.RPCs.ObserveRPCs(m.HypervisorRPC)
		i.caps.RPCs = nil // taken: a second subscriber would replace this one
	}
	if i.caps.Libvirt != nil {
		i.caps.Libvirt = libvirtSteps{i, i.caps.Libvirt}
	}
	if i.caps.Proxmox != nil {
		i.caps.Proxmox = proxmoxSteps{i, i.caps.Proxmox}
	}
	return i
}

// instrumented counts the common operations and, through its
// Capabilities, the shape steps.
type instrumented struct {
	hv   hypervisors.Hypervisor
	m    *Metrics
	caps hypervisors.Capabilities
}

var (
	_ hypervisors.Capable      = (*instrumented)(nil)
	_ hypervisors.LibvirtSteps = libvirtSteps{}
	_ hypervisors.ProxmoxSteps = proxmoxSteps{}
)

// libvirtSteps and proxmoxSteps forward to the steps found behind the
// wrapped hypervisor, counting them as i's calls.
type libvirtSteps struct {
	i  *instrumented
	lv hypervisors.LibvirtSteps
}

type proxmoxSteps struct {
	i  *instrumented
	px hypervisors.ProxmoxSteps
}

func (i *instrumented) done(op, zone string, start time.Time, err error) {
	i.m.HypervisorCall(op, zone, err, time.Since(start))
}

// Capabilities implements hypervisors.Capable.
func (i *instrumented) Capabilities() hypervisors.Capabilities { return i.caps }

func (i *instrumented) Shape() hypervisors.Shape { return i.hv.Shape() }
func (i *instrumented) Zones() []string          { return i.hv.Zones() }
func (i *instrumented) Close() error             { return i.hv.Close() }

func (i *instrumented) Observe(ctx context.Context, zone string) (z *observed.Zone, err error) {
	start := time.Now()
	defer func() { i.done("observe", zone, start, err) }()
	return i.hv.Observe(ctx, zone)
}

func (i *instrumented) Lookup(ctx context.Context, t hypervisors.Target) (vm *observed.VM, err error) {
	start := time.Now()
	defer func() { i.done("lookup", t.Zone, start, err) }()
	return i.hv.Lookup(ctx, t)
}

func (i *instrumented) Start(ctx context.Context, t hypervisors.Target) (err error) {
	start := time.Now()
	defer func() { i.done("start", t.Zone, start, err) }()
	return i.hv.Start(ctx, t)
}

func (i *instrumented) Resume(ctx context.Context, t hypervisors.Target) (err error) {
	start := time.Now()
	defer func() { i.done("resume", t.Zone, start, err) }()
	return i.hv.Resume(ctx, t)
}

func (i *instrumented) Stop(ctx context.Context, t hypervisors.Target, grace time.Duration) (err error) {
	start := time.Now()
	defer func() { i.done("stop", t.Zone, start, err) }()
	return i.hv.Stop(ctx, t, grace)
}

func (i *instrumented) SetAutostart(ctx context.Context, t hypervisors.Target, on bool) (err error) {
	start := time.Now()
	defer func() { i.done("set_autostart", t.Zone, start, err) }()
	return i.hv.SetAutostart(ctx, t, on)
}

func (i *instrumented) SetMarker(ctx context.Context, t hypervisors.Target, mk observed.Marker) (err error) {
	start := time.Now()
	defer func() { i.done("set_marker", t.Zone, start, err) }()
	return i.hv.SetMarker(ctx, t, mk)
}

func (i *instrumented) AgentPing(ctx context.Context, t hypervisors.Target) (err error) {
	start := time.Now()
	defer func() { i.done("agent_ping", t.Zone, start, err) }()
	return i.hv.AgentPing(ctx, t)
}

func (i *instrumented) AgentWriteFile(ctx context.Context, t hypervisors.Target, path string, data []byte, mode os.FileMode) (err error) {
	start := time.Now()
	defer func() { i.done("agent_write_file", t.Zone, start, err) }()
	return i.hv.AgentWriteFile(ctx, t, path, data, mode)
}

func (i *instrumented) AgentRemoveFile(ctx context.Context, t hypervisors.Target, path string) (err error) {
	start := time.Now()
	defer func() { i.done("agent_remove_file", t.Zone, start, err) }()
	return i.hv.AgentRemoveFile(ctx, t, path)
}

func (i *instrumented) AgentExec(ctx context.Context, t hypervisors.Target, argv []string) (res hypervisors.ExecResult, err error) {
	start := time.Now()
	defer func() { i.done("agent_exec", t.Zone, start, err) }()
	return i.hv.AgentExec(ctx, t, argv)
}

func (w libvirtSteps) CreateOverlay(ctx context.Context, zone string, s hypervisors.OverlaySpec) (err error) {
	start := time.Now()
	defer func() { w.i.done("create_overlay", zone, start, err) }()
	return w.lv.CreateOverlay(ctx, zone, s)
}

func (w libvirtSteps) CreateSeed(ctx context.Context, zone string, s hypervisors.SeedSpec) (err error) {
	start := time.Now()
	defer func() { w.i.done("create_seed", zone, start, err) }()
	return w.lv.CreateSeed(ctx, zone, s)
}

func (w libvirtSteps) DefineDomain(ctx context.Context, zone string, s hypervisors.DomainSpec) (err error) {
	start := time.Now()
	defer func() { w.i.done("define_domain", zone, start, err) }()
	return w.lv.DefineDomain(ctx, zone, s)
}

func (w libvirtSteps) UndefineDomain(ctx context.Context, t hypervisors.Target) (err error) {
	start := time.Now()
	defer func() { w.i.done("undefine_domain", t.Zone, start, err) }()
	return w.lv.UndefineDomain(ctx, t)
}

func (w libvirtSteps) DeleteVolume(ctx context.Context, zone, pool, name string) (err error) {
	start := time.Now()
	defer func() { w.i.done("delete_volume", zone, start, err) }()
	return w.lv.DeleteVolume(ctx, zone, pool, name)
}

func (w proxmoxSteps) CloneVM(ctx context.Context, zone string, s hypervisors.CloneSpec) (vmid int, err error) {
	start := time.Now()
	defer func() { w.i.done("clone_vm", zone, start, err) }()
	return w.px.CloneVM(ctx, zone, s)
}

func (w proxmoxSteps) ConfigureVM(ctx context.Context, t hypervisors.Target, s hypervisors.SizeSpec) (err error) {
	start := time.Now()
	defer func() { w.i.done("configure_vm", t.Zone, start, err) }()
	return w.px.ConfigureVM(ctx, t, s)
}

func (w proxmoxSteps) DeleteVM(ctx context.Context, t hypervisors.Target) (err error) {
	start := time.Now()
	defer func() { w.i.done("delete_vm", t.Zone, start, err) }()
	return w.px.DeleteVM(ctx, t)
}
