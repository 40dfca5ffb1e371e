package plugin

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// Registry is the hypervisors of one build, in order; the first is the
// default. Build it once, in the composition root, and pass it down.
type Registry struct {
	plugins []Plugin
	byName  map[string]Plugin
}

// nameRE is what a plug-in's name must match (a --hypervisor value, a
// plan's "hypervisor", a --provider label).
var nameRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)

// reserved are names a plug-in cannot take: the simulator's backend name
// and the backend choice.
var reserved = map[string]bool{"fake": true, "auto": true}

// NewRegistry checks ps and returns them as a Registry: at least one
// plug-in; each with a valid, unique name (not a backend choice), a
// title, a flag group, a default zone and create timeout, Names that are
// exactly the flags it registers, its backend flags and bounded flags
// among its own; and no flag defined by two plug-ins. Every problem is
// reported.
func NewRegistry(ps ...Plugin) (*Registry, error) {
	r := &Registry{byName: map[string]Plugin{}}
	var errs []error
	if len(ps) == 0 {
		return nil, errors.New("plugin: a registry needs at least one hypervisor")
	}
	owner := map[string]string{}
	for i, p := range ps {
		if p == nil {
			errs = append(errs, fmt.Errorf("plugin %d: is nil", i))
			continue
		}
		in := p.Info()
		what := fmt.Sprintf("plugin %q", in.Name)
		switch {
		case !nameRE.MatchString(in.Name):
			errs = append(errs, fmt.Errorf("%s: the name must match %s", what, nameRE))
		case reserved[in.Name]:
			errs = append(errs, fmt.Errorf("%s: the name is reserved (a backend choice)", what))
		case r.byName[in.Name] != nil:
			errs = append(errs, fmt.Errorf("%s: registered twice", what))
		}
		if in.Title == "" || in.FlagGroup == "" || in.DefaultZone == "" || in.CreateTimeout <= 0 {
			errs = append(errs, fmt.Errorf("%s: Info needs a Title, a FlagGroup, a DefaultZone and a positive CreateTimeout", what))
		}
		// Register on a scratch set: the flag package panics on a flag
		// defined twice on one set, so each plug-in gets its own.
		fs := flag.NewFlagSet(in.Name, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fl := registerChecked(p, fs, &errs, what)
		if fl != nil {
			names := map[string]bool{}
			for _, n := range fl.Names() {
				names[n] = true
				if fs.Lookup(n) == nil {
					errs = append(errs, fmt.Errorf("%s: Names lists --%s, which it does not register", what, n))
				}
			}
			fs.VisitAll(func(f *flag.Flag) {
				if !names[f.Name] {
					errs = append(errs, fmt.Errorf("%s: registers --%s without listing it in Names", what, f.Name))
				}
				if o, ok := owner[f.Name]; ok {
					errs = append(errs, fmt.Errorf("%s: flag --%s is also defined by %s", what, f.Name, o))
				}
				owner[f.Name] = what
			})
			for _, n := range []string{in.Backend.Flag, in.Backend.ConnFlag} {
				if !names[n] {
					errs = append(errs, fmt.Errorf("%s: the backend flag --%s is not one of its flags", what, n))
				}
			}
			switch strings.ToLower(in.Backend.Real) {
			case "", "fake", "auto":
				errs = append(errs, fmt.Errorf("%s: Backend.Real %q does not name a real substrate (the value of --%s that picks it)", what, in.Backend.Real, in.Backend.Flag))
			}
			b := fl.Bounds()
			for n := range b.Durations {
				if !names[n] {
					errs = append(errs, fmt.Errorf("%s: bounds --%s, which is not one of its flags", what, n))
				}
			}
			for n := range b.Ints {
				if !names[n] {
					errs = append(errs, fmt.Errorf("%s: bounds --%s, which is not one of its flags", what, n))
				}
			}
		}
		if r.byName[in.Name] == nil {
			r.byName[in.Name] = p
		}
		r.plugins = append(r.plugins, p)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return r, nil
}

// registerChecked registers p's flags on fs, turning a panic (a flag
// defined twice by p itself) into a problem.
func registerChecked(p Plugin, fs *flag.FlagSet, errs *[]error, what string) (fl Flags) {
	defer func() {
		if v := recover(); v != nil {
			*errs = append(*errs, fmt.Errorf("%s: registering its flags panicked: %v", what, v))
			fl = nil
		}
	}()
	return p.RegisterFlags(fs)
}

// MustRegistry is NewRegistry for the composition root: it panics on a
// registry that cannot be built (a programming error).
func MustRegistry(ps ...Plugin) *Registry {
	r, err := NewRegistry(ps...)
	if err != nil {
		panic(err)
	}
	return r
}

// Default is the hypervisor used when neither --hypervisor nor any
// plug-in's flag says otherwise.
func (r *Registry) Default() Plugin { return r.plugins[0] }

// Lookup finds a plug-in by name.
func (r *Registry) Lookup(name string) (Plugin, bool) {
	p, ok := r.byName[name]
	return p, ok
}

// All returns the plug-ins in order.
func (r *Registry) All() []Plugin { return append([]Plugin(nil), r.plugins...) }

// Names returns the plug-ins' names in order.
func (r *Registry) Names() []string {
	out := make([]string, len(r.plugins))
	for i, p := range r.plugins {
		out[i] = p.Info().Name
	}
	return out
}

// Commands returns the subcommands the plug-ins add, in order.
func (r *Registry) Commands() []Command {
	var out []Command
	for _, p := range r.plugins {
		if c, ok := p.(Commander); ok {
			out = append(out, c.Commands()...)
		}
	}
	return out
}

// Bounds merges every plug-in's bounded flags.
func (r *Registry) Bounds() Bounds {
	out := Bounds{Durations: map[string]DurationBound{}, Ints: map[string]IntBound{}}
	for _, p := range r.plugins {
		fs := flag.NewFlagSet(p.Info().Name, flag.ContinueOnError)
		b := p.RegisterFlags(fs).Bounds()
		for k, v := range b.Durations {
			out.Durations[k] = v
		}
		for k, v := range b.Ints {
			out.Ints[k] = v
		}
	}
	return out
}

// JoinTitles is titles joined for a message: "a", "a or b", "a, b or c".
func JoinTitles(titles []string, conj string) string {
	if len(titles) <= 1 {
		return strings.Join(titles, "")
	}
	return strings.Join(titles[:len(titles)-1], ", ") + " " + conj + " " + titles[len(titles)-1]
}
