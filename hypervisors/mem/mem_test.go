package mem

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/golden"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
	"github.com/bigfleet-vm/provider/inventory"
	"github.com/bigfleet-vm/provider/jsonplan"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/planner"
	"github.com/bigfleet-vm/provider/plugin"
)

// The steps below follow docs/architecture.md, "Adding a hypervisor".

// Step 2. The vocabulary: two steps. Power, the guest, binding and the
// wait for the agent are the core's.
const (
	actionCreate  = "mem-create"
	actionDestroy = "mem-destroy"
)

var actions = []hypervisors.ActionInfo{
	{Name: actionCreate, Effect: hypervisors.EffectCreate, Heavy: true, Op: "mem_create"},
	{Name: actionDestroy, Effect: hypervisors.EffectDestroy, OwnerCheck: true, Heavy: true, Op: "mem_destroy"},
}

// create makes a VM named Name of a size, carrying Marker.
type create struct {
	Name            string
	VCPU, MemoryMiB int
	Marker          observed.Marker
	Labels          map[string]string
}

func (*create) Info() hypervisors.ActionInfo { return actions[0] }

func (c *create) PlanJSON(out *jsonplan.Params) {
	out.Ext = &jsonplan.Ext{Args: map[string]string{"name": c.Name,
		"vcpu": strconv.Itoa(c.VCPU), "memory_mib": strconv.Itoa(c.MemoryMiB), "machine": c.Marker.MachineID}}
}

// destroy removes the VM and everything it has.
type destroy struct{}

func (*destroy) Info() hypervisors.ActionInfo { return actions[1] }

func (*destroy) PlanJSON(out *jsonplan.Params) {
	out.Ext = &jsonplan.Ext{} // the core writes the effect from Info
}

// Step 4. Planning: pure, over the planner's Builder.
type memPlanner struct{}

func (memPlanner) Name() string                      { return "mem" }
func (memPlanner) Actions() []hypervisors.ActionInfo { return actions }
func (memPlanner) DriftKinds() []planner.DriftKind   { return nil }

func (memPlanner) Observation() planner.Observation {
	return planner.Observation{Identity: planner.ByID}
}

func (memPlanner) Create(b *planner.Builder, vm *observed.VM) {
	if vm != nil {
		b.EnsureRunning(vm, "intent:create")
		return
	}
	m := b.Machine()
	t := hypervisors.Target{Zone: m.Zone, Name: m.VMName}
	b.Add(t, "", &create{Name: m.VMName, VCPU: m.VCPU, MemoryMiB: m.MemoryMiB, Marker: b.Marker(""), Labels: m.Labels}, "missing")
	b.Start(t, "intent:create")
}

func (memPlanner) Destroy(b *planner.Builder, vm *observed.VM, reason string, _ bool) {
	if vm != nil {
		b.AddOn(vm, "", &destroy{}, reason)
	}
}

func (memPlanner) Bootstrap(m *desired.Machine) ([]string, string) {
	return []string{simcore.DefaultBootstrapHook, m.Cluster}, "/opt/bigfleet/bootstrap.blob"
}

func (memPlanner) Volumes(*desired.Machine) (string, []string) { return "", nil }

// Step 5. The plug-in: one flag, the simulator only.
type memPlugin struct{}

// Plugin is mem as a registry takes it.
func Plugin() plugin.Plugin { return memPlugin{} }

func (memPlugin) Info() plugin.Info {
	return plugin.Info{Name: "mem", Title: "mem", FlagGroup: "mem simulator parameters", DefaultZone: "mem", CreateTimeout: 5 * time.Minute,
		Backend: plugin.Backend{Flag: "mem-backend", Real: "mem", ConnFlag: "mem-backend", RealNoun: "mem host", RealNouns: "mem hosts"}}
}

type memFlags struct{ backend *string }

func (memPlugin) RegisterFlags(fs *flag.FlagSet) plugin.Flags {
	return &memFlags{backend: fs.String("mem-backend", "auto", "fake or auto: mem has its simulator only (pass --use-fake-backend).")}
}

func (*memFlags) Names() []string                         { return []string{"mem-backend"} }
func (*memFlags) Usage() []string                         { return []string{"mem-backend"} }
func (*memFlags) Bounds() plugin.Bounds                   { return plugin.Bounds{} }
func (f *memFlags) Backend() (string, bool)               { return *f.backend, false }
func (*memFlags) ReportsDefaultZone(map[string]bool) bool { return false }

func (*memFlags) Resolve(env plugin.Env, p plugin.Problems) plugin.Resolved {
	if env.Real {
		p.Add("mem-backend", "mem has no real backend; pass --use-fake-backend")
	}
	return resolved{}
}

type resolved struct{}

func (resolved) Zones() ([]string, string)        { return nil, "mem-backend" }
func (resolved) Capacity() inventory.CapacityType { return inventory.OnDemand }
func (resolved) Certs() []plugin.CertFile         { return nil }
func (resolved) Summary() (string, []slog.Attr)   { return "", nil }

func (resolved) Catalog() inventory.CatalogRules {
	return inventory.CatalogRules{Prefix: "mem.", Keys: "vcpu, memory_mib", Source: func(v *int) (int, error) {
		if v != nil {
			return 0, errors.New("template_vmid means nothing to mem; remove the key")
		}
		return 0, nil
	}}
}

func (resolved) CapacityRules() inventory.CapacityRules {
	return inventory.CapacityRules{Where: "the mem simulator", RefuseBareMetal: func(spelling string) error {
		return fmt.Errorf("capacity type %q: the mem simulator offers on_demand only", spelling)
	}}
}

func (resolved) Planner(plugin.PlannerOptions) planner.Plugin { return memPlanner{} }

func (resolved) Open(context.Context, plugin.OpenOptions) (hypervisors.Hypervisor, error) {
	return nil, fmt.Errorf("mem has no real backend: %w", hypervisors.ErrUnsupported)
}

func (resolved) OpenSimulator(o plugin.SimOptions) (hypervisors.Hypervisor, error) {
	opts := simcore.Options{Zones: o.Zones, Latency: o.Latency, Faults: o.Faults, SlowOK: o.SlowOK, Host: o.Host, State: o.State, ReadOnly: o.ReadOnly}
	if o.Journal != nil {
		opts.Store = o.Journal
	}
	return openWorld(opts)
}

// Step 8. The proof.

var update = flag.Bool("update", false, "rewrite the expected plans of testdata/*.txtar")

// goldenWorld is the golden runner's view of the runtime.
type goldenWorld struct{ *world }

func (w goldenWorld) AddVM(zone, name string, id int, mk *observed.Marker, _ bool, power observed.Power) (hypervisors.Target, error) {
	id, err := w.addVM(zone, id, name, mk, power)
	return hypervisors.Target{Zone: zone, Name: name, VMID: id}, err
}

func (goldenWorld) AddFixture(string, string, golden.Fixture) error {
	return fmt.Errorf("mem has no fixtures: %w", hypervisors.ErrUnsupported)
}

var goldenSetup = golden.Setup{
	Name: "mem", Zones: []string{"mem-a", "mem-b"}, Type: "mem.small",
	Planner: func(keys map[string]string) (planner.Plugin, error) {
		if len(keys) > 0 {
			return nil, fmt.Errorf("mem has no planner keys (got %d)", len(keys))
		}
		return memPlanner{}, nil
	},
	World: func(zones []string, now func() time.Time) golden.World {
		return goldenWorld{newWorld(simcore.Options{Zones: zones, Clock: now})}
	},
}

// TestGolden plans, applies and re-plans mem's cases with the golden
// runner: format 1.2 plans, validated against the published schema.
func TestGolden(t *testing.T) {
	golden.Run(t, "testdata", *update, 5, goldenSetup)
}

// TestRegistryRefusesClashes: a plug-in may not take a flag or a name
// another already has.
func TestRegistryRefusesClashes(t *testing.T) {
	if _, err := plugin.NewRegistry(Plugin()); err != nil {
		t.Fatalf("mem alone: %v", err)
	}
	if _, err := plugin.NewRegistry(Plugin(), Plugin()); err == nil {
		t.Error("a registry took mem twice")
	}
}
