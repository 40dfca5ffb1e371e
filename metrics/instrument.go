package metrics

import (
	"context"
	"os"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/observed"
)

// Instrument wraps a hypervisor so every call is counted and timed by
// operation and outcome.
func Instrument(hv hypervisors.Hypervisor, m *Metrics) hypervisors.Hypervisor {
	if m == nil {
		return hv
	}
	return &instrumented{hv: hv, m: m}
}

type instrumented struct {
	hv hypervisors.Hypervisor
	m  *Metrics
}

func (i *instrumented) done(op string, start time.Time, err error) {
	i.m.HypervisorCall(op, err, time.Since(start))
}

// Unwrap returns the wrapped hypervisor.
func (i *instrumented) Unwrap() hypervisors.Hypervisor { return i.hv }

func (i *instrumented) Shape() hypervisors.Shape { return i.hv.Shape() }
func (i *instrumented) Zones() []string          { return i.hv.Zones() }
func (i *instrumented) Close() error             { return i.hv.Close() }

// ZoneHealth forwards to the wrapped hypervisor when it reports health.
func (i *instrumented) ZoneHealth() map[string]error {
	if h, ok := i.hv.(hypervisors.HealthReporter); ok {
		return h.ZoneHealth()
	}
	return nil
}

func (i *instrumented) Observe(ctx context.Context, zone string) (z *observed.Zone, err error) {
	start := time.Now()
	defer func() { i.done("observe", start, err) }()
	return i.hv.Observe(ctx, zone)
}

func (i *instrumented) Lookup(ctx context.Context, t hypervisors.Target) (vm *observed.VM, err error) {
	start := time.Now()
	defer func() { i.done("lookup", start, err) }()
	return i.hv.Lookup(ctx, t)
}

func (i *instrumented) CreateOverlay(ctx context.Context, zone string, s hypervisors.OverlaySpec) (err error) {
	start := time.Now()
	defer func() { i.done("create_overlay", start, err) }()
	return i.hv.CreateOverlay(ctx, zone, s)
}

func (i *instrumented) CreateSeed(ctx context.Context, zone string, s hypervisors.SeedSpec) (err error) {
	start := time.Now()
	defer func() { i.done("create_seed", start, err) }()
	return i.hv.CreateSeed(ctx, zone, s)
}

func (i *instrumented) DefineDomain(ctx context.Context, zone string, s hypervisors.DomainSpec) (err error) {
	start := time.Now()
	defer func() { i.done("define_domain", start, err) }()
	return i.hv.DefineDomain(ctx, zone, s)
}

func (i *instrumented) UndefineDomain(ctx context.Context, t hypervisors.Target) (err error) {
	start := time.Now()
	defer func() { i.done("undefine_domain", start, err) }()
	return i.hv.UndefineDomain(ctx, t)
}

func (i *instrumented) DeleteVolume(ctx context.Context, zone, pool, name string) (err error) {
	start := time.Now()
	defer func() { i.done("delete_volume", start, err) }()
	return i.hv.DeleteVolume(ctx, zone, pool, name)
}

func (i *instrumented) CloneVM(ctx context.Context, zone string, s hypervisors.CloneSpec) (vmid int, err error) {
	start := time.Now()
	defer func() { i.done("clone_vm", start, err) }()
	return i.hv.CloneVM(ctx, zone, s)
}

func (i *instrumented) ConfigureVM(ctx context.Context, t hypervisors.Target, s hypervisors.SizeSpec) (err error) {
	start := time.Now()
	defer func() { i.done("configure_vm", start, err) }()
	return i.hv.ConfigureVM(ctx, t, s)
}

func (i *instrumented) DeleteVM(ctx context.Context, t hypervisors.Target) (err error) {
	start := time.Now()
	defer func() { i.done("delete_vm", start, err) }()
	return i.hv.DeleteVM(ctx, t)
}

func (i *instrumented) Start(ctx context.Context, t hypervisors.Target) (err error) {
	start := time.Now()
	defer func() { i.done("start", start, err) }()
	return i.hv.Start(ctx, t)
}

func (i *instrumented) Resume(ctx context.Context, t hypervisors.Target) (err error) {
	start := time.Now()
	defer func() { i.done("resume", start, err) }()
	return i.hv.Resume(ctx, t)
}

func (i *instrumented) Stop(ctx context.Context, t hypervisors.Target, grace time.Duration) (err error) {
	start := time.Now()
	defer func() { i.done("stop", start, err) }()
	return i.hv.Stop(ctx, t, grace)
}

func (i *instrumented) SetAutostart(ctx context.Context, t hypervisors.Target, on bool) (err error) {
	start := time.Now()
	defer func() { i.done("set_autostart", start, err) }()
	return i.hv.SetAutostart(ctx, t, on)
}

func (i *instrumented) SetMarker(ctx context.Context, t hypervisors.Target, mk observed.Marker) (err error) {
	start := time.Now()
	defer func() { i.done("set_marker", start, err) }()
	return i.hv.SetMarker(ctx, t, mk)
}

func (i *instrumented) AgentPing(ctx context.Context, t hypervisors.Target) (err error) {
	start := time.Now()
	defer func() { i.done("agent_ping", start, err) }()
	return i.hv.AgentPing(ctx, t)
}

func (i *instrumented) AgentWriteFile(ctx context.Context, t hypervisors.Target, path string, data []byte, mode os.FileMode) (err error) {
	start := time.Now()
	defer func() { i.done("agent_write_file", start, err) }()
	return i.hv.AgentWriteFile(ctx, t, path, data, mode)
}

func (i *instrumented) AgentRemoveFile(ctx context.Context, t hypervisors.Target, path string) (err error) {
	start := time.Now()
	defer func() { i.done("agent_remove_file", start, err) }()
	return i.hv.AgentRemoveFile(ctx, t, path)
}

func (i *instrumented) AgentExec(ctx context.Context, t hypervisors.Target, argv []string) (res hypervisors.ExecResult, err error) {
	start := time.Now()
	defer func() { i.done("agent_exec", start, err) }()
	return i.hv.AgentExec(ctx, t, argv)
}
