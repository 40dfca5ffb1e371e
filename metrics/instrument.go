package metrics

import (
	"context"
	"os"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/observed"
)

// Instrument wraps a hypervisor so every call is counted and timed by
// operation and outcome. It is one type whatever the adapter offers: the
// steps of the hypervisor's own vocabulary go through Apply and are
// counted under their ActionInfo's op; its Capabilities are the
// adapter's (health, events, volume and capacity reads pass through
// uncounted); the adapter's RPC reports are subscribed to here, once.
func Instrument(hv hypervisors.Hypervisor, m *Metrics) hypervisors.Hypervisor {
	if m == nil {
		return hv
	}
	i := &instrumented{hv: hv, m: m, caps: hypervisors.CapabilitiesOf(hv)}
	if i.caps.RPCs != nil {
		i.caps.RPCs.ObserveRPCs(m.HypervisorRPC)
		i.caps.RPCs = nil // taken: a second subscriber would replace this one
	}
	return i
}

// instrumented counts every operation of the hypervisor it wraps.
type instrumented struct {
	hv   hypervisors.Hypervisor
	m    *Metrics
	caps hypervisors.Capabilities
}

var _ hypervisors.Capable = (*instrumented)(nil)

func (i *instrumented) done(op, zone string, start time.Time, err error) {
	i.m.HypervisorCall(op, zone, err, time.Since(start))
}

// Capabilities implements hypervisors.Capable.
func (i *instrumented) Capabilities() hypervisors.Capabilities { return i.caps }

func (i *instrumented) Zones() []string { return i.hv.Zones() }
func (i *instrumented) Close() error    { return i.hv.Close() }

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

func (i *instrumented) Apply(ctx context.Context, t hypervisors.Target, p hypervisors.StepParams) (vmid int, err error) {
	start := time.Now()
	defer func() { i.done(p.Info().Op, t.Zone, start, err) }()
	return i.hv.Apply(ctx, t, p)
}
