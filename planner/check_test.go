package planner_test

import (
	"strings"
	"testing"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox"
	"github.com/bigfleet-vm/provider/planner"
)

// vocab is a plug-in whose vocabulary is given.
type vocab struct {
	planner.Plugin
	actions []hypervisors.ActionInfo
	kinds   []planner.DriftKind
}

func (v vocab) Name() string                      { return "x" }
func (v vocab) Actions() []hypervisors.ActionInfo { return v.actions }
func (v vocab) DriftKinds() []planner.DriftKind   { return v.kinds }

// TestCheckPlugin: the shipped vocabularies pass; a plug-in action named
// as a core action (which the executor would run as the core's), twice,
// outside the plan's action pattern, or without an effect or op is
// refused, every problem at once.
func TestCheckPlugin(t *testing.T) {
	for _, pl := range []planner.Plugin{libvirt.Planner(libvirt.PlanSettings{}), proxmox.Planner(proxmox.PlanSettings{})} {
		if err := planner.CheckPlugin(pl); err != nil {
			t.Errorf("%s: %v", pl.Name(), err)
		}
	}
	ok := hypervisors.ActionInfo{Name: "x-make", Effect: hypervisors.EffectCreate, Op: "x_make"}
	bad := []hypervisors.ActionInfo{
		ok, ok,
		{Name: "bind", Effect: hypervisors.EffectChange, Op: "x_bind"},
		{Name: "X2", Effect: hypervisors.EffectChange, Op: "x_two"},
		{Name: "x-odd", Effect: "teleport", Op: ""},
	}
	err := planner.CheckPlugin(vocab{actions: bad, kinds: []planner.DriftKind{"x-stale", "x-stale", "stopped", "Odd kind"}})
	if err == nil {
		t.Fatal("a bad vocabulary passed")
	}
	for _, want := range []string{`"x-make": declared twice`, `"bind": a core action's name`, `"X2": not a plan action name`,
		`"x-odd": effect "teleport"`, `"x-odd": metrics op ""`, `drift kind "x-stale": a core kind or declared twice`,
		`drift kind "stopped": a core kind`, `drift kind "Odd kind": not a plan drift kind`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %s:\n%v", want, err)
		}
	}
}
