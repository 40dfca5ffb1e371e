package layout

import (
	"encoding/json"
	"errors"
	"fmt"
	"go/types"
	"io"
	"slices"
	"strings"
	"testing"
)

// notRooms are the directories under hypervisors/ that are no
// hypervisor's own: the guest-command protocol every room implements and
// the simulators' shared core (neutral).
var notRooms = map[string]bool{"guest": true, "simcore": true}

// knownRooms must be found, so the rule is never vacuous.
var knownRooms = []string{impl + "libvirt", impl + "mem", impl + "proxmox"}

// room returns the room the package at import path p is in: every other
// directory under hypervisors/ is a hypervisor's own (it owns everything
// about its hypervisor: adapter, vocabulary, simulators), a new one the
// moment it exists; "" for anything else.
func room(p string) string {
	rest, ok := strings.CutPrefix(p, impl)
	if !ok {
		return ""
	}
	d, _, _ := strings.Cut(rest, "/")
	if notRooms[d] {
		return ""
	}
	return impl + d
}

// neutral are the directories every room's simulator builds on (the
// shared simulator core and its suite): they depend on no room, tests
// included.
var neutral = []string{module + "/hypervisors/simcore"}

// under reports whether the package at import path p is dir or below it.
func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// roomOf returns the room (or neutral directory) p is under, or "".
func roomOf(p string, dirs []string) string {
	for _, d := range dirs {
		if under(p, d) {
			return d
		}
	}
	return ""
}

// testListed is one package of go list -json with its tests' imports.
type testListed struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// prodGraph returns every package's production imports: the module's
// and their dependencies', the tests' dependencies included (go list
// -deps -test), without the test variants' own test imports.
func prodGraph(t *testing.T, dir string, patterns ...string) map[string][]string {
	t.Helper()
	out := goList(t, dir, append([]string{"-e", "-deps", "-test", "-json=ImportPath,Imports"}, patterns...)...)
	strip := func(p string) string { p, _, _ = strings.Cut(p, " "); return p }
	graph := map[string][]string{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list -json: %v", err)
		}
		path, variant, isVariant := strings.Cut(p.ImportPath, " ")
		// "p [p.test]" is p with its test files: not p's production
		// imports. "p_test" and "p.test" are tests, not packages.
		if strings.HasSuffix(path, "_test") || strings.HasSuffix(path, ".test") ||
			isVariant && variant == "["+path+".test]" {
			continue
		}
		for _, q := range p.Imports {
			if q = strip(q); !slices.Contains(graph[path], q) {
				graph[path] = append(graph[path], q)
			}
		}
		if _, ok := graph[path]; !ok {
			graph[path] = nil
		}
	}
	return graph
}

// chainTo returns a shortest import chain from the imports start of a
// package to a package for which bad is true (nil: none).
func chainTo(graph map[string][]string, start []string, bad func(string) bool) []string {
	prev := map[string]string{}
	var queue []string
	for _, s := range start {
		if _, ok := prev[s]; !ok {
			prev[s] = ""
			queue = append(queue, s)
		}
	}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if bad(p) {
			var chain []string
			for q := p; q != ""; q = prev[q] {
				chain = append(chain, strings.TrimPrefix(q, module+"/"))
			}
			slices.Reverse(chain)
			return chain
		}
		for _, q := range graph[p] {
			if _, ok := prev[q]; !ok {
				prev[q] = p
				queue = append(queue, q)
			}
		}
	}
	return nil
}

// TestRoomsImportNoOtherRoom: no package of a hypervisor's room depends,
// directly or through others, on another room, and the shared simulator
// core depends on no room; a package's tests (TestImports and
// XTestImports) count as the package.
func TestRoomsImportNoOtherRoom(t *testing.T) {
	dir := moduleRoot(t)
	graph := prodGraph(t, dir, "./hypervisors/...")
	out := goList(t, dir, "-e", "-json=ImportPath,Imports,TestImports,XTestImports", "./hypervisors/...")
	var problems []string
	checked := 0
	found := map[string]bool{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p testListed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list -json: %v", err)
		}
		own := room(p.ImportPath)
		forbidden := func(q string) bool { r := room(q); return r != "" && r != own }
		what := "room " + strings.TrimPrefix(own, module+"/")
		if own != "" {
			found[own] = true
		}
		if own == "" {
			if n := roomOf(p.ImportPath, neutral); n != "" {
				forbidden = func(q string) bool { return room(q) != "" }
				what = "shared " + strings.TrimPrefix(n, module+"/")
			} else {
				continue
			}
		}
		checked++
		for _, imp := range []struct {
			kind string
			list []string
		}{{"", p.Imports}, {"tests ", p.TestImports}, {"external tests ", p.XTestImports}} {
			var start []string
			for _, q := range imp.list {
				if q != p.ImportPath {
					start = append(start, q)
				}
			}
			if chain := chainTo(graph, start, forbidden); chain != nil {
				via := ""
				if len(chain) > 1 {
					via = " through " + strings.Join(chain[:len(chain)-1], " -> ")
				}
				problems = append(problems, fmt.Sprintf("%s (%s): %simport %s%s; a room imports no other room, and what rooms share lives outside them",
					strings.TrimPrefix(p.ImportPath, module+"/"), what, imp.kind, chain[len(chain)-1], via))
			}
		}
	}
	// The rule is not vacuous: every room and neutral directory holds
	// packages.
	if want := len(knownRooms) + len(neutral); checked < want {
		t.Errorf("checked %d packages, want at least %d: are knownRooms and neutral out of date?", checked, want)
	}
	for _, r := range knownRooms {
		if !found[r] {
			t.Errorf("room %s holds no package", r)
		}
	}
	report(t, problems)
}

// TestChainTo pins the search the room rule relies on: it follows
// imports transitively and names the path it took.
func TestChainTo(t *testing.T) {
	graph := map[string][]string{
		module + "/a": {module + "/b"},
		module + "/b": {module + "/c"},
		module + "/c": nil,
	}
	bad := func(p string) bool { return p == module+"/c" }
	got := chainTo(graph, []string{module + "/a"}, bad)
	want := []string{"a", "b", "c"}
	if !slices.Equal(want, got) {
		t.Errorf("chain %v, want %v", got, want)
	}
	if got := chainTo(graph, []string{module + "/c"}, func(string) bool { return false }); got != nil {
		t.Errorf("chain with nothing forbidden: %v", got)
	}
	for p, want := range map[string]string{
		impl + "libvirt/lvspec":  impl + "libvirt",
		impl + "libvirtx":        impl + "libvirtx", // a room of its own, not libvirt's
		impl + "third":           impl + "third",    // a new hypervisor is a room at once
		impl + "guest/guestsim":  "",
		impl + "simcore/simtest": "",
		module + "/hypervisors":  "",
		module + "/planner":      "",
	} {
		if got := room(p); got != want {
			t.Errorf("room(%s) = %q, want %q", p, got, want)
		}
	}
}

// TestSimcoreOptionsAreShared: every field of simcore.Options is read by
// simcore itself (its non-test files). A field only a room reads is that
// hypervisor's setting and belongs in the room's own Options
// (libvirtsim.Options, proxmoxsim.Options), which embed simcore's.
func TestSimcoreOptionsAreShared(t *testing.T) {
	const core = module + "/hypervisors/simcore"
	pkgs := typeCheck(t, moduleRoot(t), []string{core})
	if len(pkgs) != 1 {
		t.Fatalf("type-checked %d packages, want 1", len(pkgs))
	}
	info := pkgs[0].info
	var fields *types.Struct
	for id, obj := range info.Defs {
		if tn, ok := obj.(*types.TypeName); ok && id.Name == "Options" && tn.Parent() == tn.Pkg().Scope() {
			fields, _ = tn.Type().Underlying().(*types.Struct)
		}
	}
	if fields == nil || fields.NumFields() == 0 {
		t.Fatal("simcore.Options not found")
	}
	read := map[*types.Var]bool{}
	for _, sel := range info.Selections {
		if v, ok := sel.Obj().(*types.Var); ok && v.IsField() {
			read[v] = true
		}
	}
	var problems []string
	for i := range fields.NumFields() {
		if f := fields.Field(i); !read[f] {
			problems = append(problems, fmt.Sprintf("simcore.Options.%s: simcore never reads it; a room's own setting belongs in the room's simulator Options", f.Name()))
		}
	}
	report(t, problems)
}
