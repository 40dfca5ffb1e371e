package plugin_test

import (
	"context"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/plugin"
	"github.com/google/go-cmp/cmp"
)

// stub is a minimal plug-in: a name and flags, nothing resolved.
type stub struct {
	info   plugin.Info
	flags  []string // registered
	names  []string // listed by Names (nil: flags)
	bounds plugin.Bounds
	twice  bool // registers its first flag twice
	cmds   []plugin.Command
}

func newStub(name string, flags ...string) *stub {
	return &stub{info: plugin.Info{Name: name, Title: strings.ToUpper(name), FlagGroup: name + " flags", DefaultZone: "z",
		CreateTimeout: time.Minute, Backend: plugin.Backend{Flag: flags[0], Real: name, ConnFlag: flags[len(flags)-1]}}, flags: flags}
}

func (s *stub) Info() plugin.Info { return s.info }

func (s *stub) RegisterFlags(fs *flag.FlagSet) plugin.Flags {
	for _, n := range s.flags {
		fs.String(n, "", "")
	}
	if s.twice {
		fs.String(s.flags[0], "", "")
	}
	names := s.names
	if names == nil {
		names = s.flags
	}
	return stubFlags{names: names, bounds: s.bounds}
}

type stubFlags struct {
	names  []string
	bounds plugin.Bounds
}

func (f stubFlags) Names() []string                                     { return f.names }
func (f stubFlags) Usage() []string                                     { return f.names }
func (f stubFlags) Bounds() plugin.Bounds                               { return f.bounds }
func (f stubFlags) Backend() (string, bool)                             { return "", false }
func (f stubFlags) ReportsDefaultZone(map[string]bool) bool             { return false }
func (f stubFlags) Resolve(plugin.Env, plugin.Problems) plugin.Resolved { return nil }

// commander is a stub that adds subcommands.
type commander struct{ *stub }

func (c commander) Commands() []plugin.Command { return c.cmds }

func TestNewRegistryRefuses(t *testing.T) {
	with := func(s *stub, change func(*stub)) *stub { change(s); return s }
	tests := []struct {
		name    string
		plugins []plugin.Plugin
		want    string // a substring of the error
	}{
		{"none", nil, "needs at least one hypervisor"},
		{"nil", []plugin.Plugin{nil}, "plugin 0: is nil"},
		{"bad name", []plugin.Plugin{newStub("Xen", "xen-backend")}, `plugin "Xen": the name must match`},
		{"long name", []plugin.Plugin{newStub(strings.Repeat("a", 33), "a-backend")}, "the name must match"},
		{"reserved name", []plugin.Plugin{newStub("fake", "fake-backend")}, `plugin "fake": the name is reserved`},
		{"twice", []plugin.Plugin{newStub("a", "a-backend"), newStub("a", "a2-backend")}, `plugin "a": registered twice`},
		{"no title", []plugin.Plugin{with(newStub("a", "a-backend"), func(s *stub) { s.info.Title = "" })}, "Info needs a Title"},
		{"no create timeout", []plugin.Plugin{with(newStub("a", "a-backend"), func(s *stub) { s.info.CreateTimeout = 0 })}, "positive CreateTimeout"},
		{"a flag of another plug-in", []plugin.Plugin{newStub("a", "a-backend", "nodes"), newStub("b", "b-backend", "nodes")},
			`plugin "b": flag --nodes is also defined by plugin "a"`},
		{"a flag registered twice", []plugin.Plugin{with(newStub("a", "a-backend"), func(s *stub) { s.twice = true })}, "registering its flags panicked"},
		{"Names lists an unregistered flag", []plugin.Plugin{with(newStub("a", "a-backend"), func(s *stub) { s.names = []string{"a-backend", "ghost"} })},
			"Names lists --ghost, which it does not register"},
		{"a registered flag not in Names", []plugin.Plugin{with(newStub("a", "a-backend", "a-url"), func(s *stub) { s.names = []string{"a-backend"} })},
			"registers --a-url without listing it in Names"},
		{"a backend flag of someone else", []plugin.Plugin{with(newStub("a", "a-backend"), func(s *stub) { s.info.Backend.ConnFlag = "connect" })},
			"the backend flag --connect is not one of its flags"},
		{"no real backend value", []plugin.Plugin{with(newStub("a", "a-backend"), func(s *stub) { s.info.Backend.Real = "" })},
			`Backend.Real "" does not name a real substrate`},
		{"fake is not a real backend", []plugin.Plugin{with(newStub("a", "a-backend"), func(s *stub) { s.info.Backend.Real = "fake" })},
			`Backend.Real "fake" does not name a real substrate`},
		{"bounds of someone else's flag", []plugin.Plugin{with(newStub("a", "a-backend"), func(s *stub) {
			s.bounds = plugin.Bounds{Ints: map[string]plugin.IntBound{"seed-count": {Min: 1, Max: 2}}}
		})}, "bounds --seed-count, which is not one of its flags"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := plugin.NewRegistry(tt.plugins...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("NewRegistry = %v, %v; want an error containing %q", r, err, tt.want)
			}
		})
	}
}

func TestRegistry(t *testing.T) {
	a := newStub("a", "a-backend", "a-url")
	a.bounds = plugin.Bounds{Durations: map[string]plugin.DurationBound{"a-url": {Max: time.Second}}}
	run := func(context.Context, []string, io.Writer, io.Writer) int { return 0 }
	b := commander{newStub("b", "b-backend", "b-url")}
	b.cmds = []plugin.Command{{Name: "b-sim", What: "serve b's simulator", Run: run}}
	b.bounds = plugin.Bounds{Ints: map[string]plugin.IntBound{"b-url": {Max: 9}}}
	r := plugin.MustRegistry(a, b)
	if r.Default() != plugin.Plugin(a) {
		t.Errorf("Default = %v, want the first", r.Default().Info().Name)
	}
	if diff := cmp.Diff([]string{"a", "b"}, r.Names()); diff != "" {
		t.Errorf("Names (-want +got):\n%s", diff)
	}
	if p, ok := r.Lookup("b"); !ok || p.Info().Name != "b" {
		t.Errorf("Lookup(b) = %v, %t", p, ok)
	}
	if _, ok := r.Lookup("c"); ok {
		t.Error("Lookup(c) found a plug-in")
	}
	if got := r.Commands(); len(got) != 1 || got[0].Name != "b-sim" {
		t.Errorf("Commands = %+v", got)
	}
	bounds := r.Bounds()
	if _, ok := bounds.Durations["a-url"]; !ok {
		t.Errorf("Bounds lacks a's row: %+v", bounds)
	}
	if _, ok := bounds.Ints["b-url"]; !ok {
		t.Errorf("Bounds lacks b's row: %+v", bounds)
	}
}

func TestMustRegistryPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("MustRegistry of two plug-ins with one name did not panic")
		}
	}()
	plugin.MustRegistry(newStub("a", "a-backend"), newStub("a", "b-backend"))
}

func TestJoinTitles(t *testing.T) {
	for _, tt := range []struct {
		in   []string
		want string
	}{{nil, ""}, {[]string{"a"}, "a"}, {[]string{"a", "b"}, "a or b"}, {[]string{"a", "b", "c"}, "a, b or c"}} {
		if got := plugin.JoinTitles(tt.in, "or"); got != tt.want {
			t.Errorf("JoinTitles(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
