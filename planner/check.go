package planner

import (
	"errors"
	"fmt"
	"regexp"

	"github.com/bigfleet-vm/provider/hypervisors"
)

var (
	actionName = regexp.MustCompile(`^[a-z][a-z-]{0,31}$`) // the plan schema's action pattern
	opName     = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)
	effects    = map[hypervisors.Effect]bool{hypervisors.EffectCreate: true, hypervisors.EffectStart: true,
		hypervisors.EffectChange: true, hypervisors.EffectDestroy: true}
)

// CheckPlugin checks a plug-in's step vocabulary once, before anything is
// planned with it: every action is named as a plan's action may be
// (^[a-z][a-z-]{0,31}$), once, and not as a core action (the executor
// runs a core action itself, whatever params a step carries); its effect
// is one of the four and its metrics op is set. It reports every problem
// at once.
func CheckPlugin(pl Plugin) error {
	var errs []error
	seen := map[string]bool{}
	for _, a := range pl.Actions() {
		_, core := coreInfo[Action(a.Name)]
		switch {
		case !actionName.MatchString(a.Name):
			errs = append(errs, fmt.Errorf("action %q: not a plan action name (^[a-z][a-z-]{0,31}$)", a.Name))
		case core:
			errs = append(errs, fmt.Errorf("action %q: a core action's name", a.Name))
		case seen[a.Name]:
			errs = append(errs, fmt.Errorf("action %q: declared twice", a.Name))
		}
		seen[a.Name] = true
		if !effects[a.Effect] {
			errs = append(errs, fmt.Errorf("action %q: effect %q is not create, start, change or destroy", a.Name, a.Effect))
		}
		if !opName.MatchString(a.Op) {
			errs = append(errs, fmt.Errorf("action %q: metrics op %q is not a label value (^[a-z][a-z0-9_]*$)", a.Name, a.Op))
		}
	}
	kinds := map[DriftKind]bool{}
	for _, k := range DriftKinds {
		kinds[k] = true
	}
	for _, k := range pl.DriftKinds() {
		switch {
		case !actionName.MatchString(string(k)):
			errs = append(errs, fmt.Errorf("drift kind %q: not a plan drift kind (^[a-z][a-z-]{0,31}$)", k))
		case kinds[k]:
			errs = append(errs, fmt.Errorf("drift kind %q: a core kind or declared twice", k))
		}
		kinds[k] = true
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("hypervisor %s: %w", pl.Name(), err)
	}
	return nil
}
