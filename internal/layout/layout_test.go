package layout

import (
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// module is the import path of the module whose layout is checked.
const module = "github.com/bigfleet-vm/provider"

// impl is the prefix of every hypervisor implementation package; the
// contract package module+"/hypervisors" itself is core.
const impl = module + "/hypervisors/"

// class is which side of the house a package is on.
type class int

const (
	// core packages import no implementation and never ask which
	// hypervisor they serve.
	core class = iota + 1
	// implementation packages are the hypervisors (hypervisors/...).
	implementation
	// root is the composition root, the one package that imports both
	// sides to build the registry.
	root
	// testOnly packages are black-box suites and test helpers' tests:
	// nothing imports them.
	testOnly
)

// topLevel classifies every top-level directory of the module that holds
// a package. hypervisors is special: the package itself is core (the
// contract), its subpackages are implementations. A package under a
// top-level directory missing here fails TestEveryPackageIsClassified.
var topLevel = map[string]class{
	"api":         core, // the generated wire
	"capacity":    core,
	"cli":         core,
	"conffile":    core,
	"config":      core,
	"desired":     core,
	"etcdstore":   core,
	"executor":    core,
	"golden":      core,
	"hypervisors": core,
	"internal":    core,
	"inventory":   core,
	"jsonhistory": core,
	"jsonplan":    core,
	"kv":          core,
	"metrics":     core,
	"naming":      core,
	"observed":    core,
	"planner":     core,
	"plugin":      core,
	"reconciler":  core,
	"retry":       core,
	"server":      core,
	"service":     core,
	"statefile":   core,
	"version":     core,

	"cmd": root,

	"acceptance": testOnly,
	"docs":       testOnly,
	"e2e":        testOnly,
}

// shared are the packages under hypervisors/ that are contracts, not
// rooms: the guest-command protocol, written once for every hypervisor
// (the executor runs it over any adapter's agent methods; its simulated
// guest and test suite, guestsim and guesttest, are implementations).
var shared = map[string]bool{module + "/hypervisors/guest": true}

// isImpl reports whether the package at import path p is a hypervisor
// implementation.
func isImpl(p string) bool { return strings.HasPrefix(p, impl) && !shared[p] }

// knownNames are hypervisor names checked even when no implementation
// registers them (yet): the two of the product and the tests' third.
var knownNames = []string{"libvirt", "proxmox", "mem"}

// classify says which side of the house the package at import path p is
// on; ok is false when its top-level directory is not classified.
func classify(p string) (c class, ok bool) {
	rel := strings.TrimPrefix(p, module+"/")
	if isImpl(p) {
		return implementation, true
	}
	top, _, _ := strings.Cut(rel, "/")
	c, ok = topLevel[top]
	return c, ok
}

// moduleRoot is the directory of the module's go.mod.
func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		t.Fatal("go env GOMOD: not inside a module")
	}
	return filepath.Dir(mod)
}

// goList runs go list in the module root and returns its stdout.
func goList(t *testing.T, dir string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// modulePackages are the import paths of the module's packages (go list
// ./...), sorted.
func modulePackages(t *testing.T, dir string) []string {
	t.Helper()
	var ps []string
	for _, l := range strings.Split(strings.TrimSpace(string(goList(t, dir, "-e", "./..."))), "\n") {
		if l != "" {
			ps = append(ps, l)
		}
	}
	sort.Strings(ps)
	return ps
}

// corePackages are the module's core packages, sorted.
func corePackages(t *testing.T, dir string) []string {
	t.Helper()
	var cs []string
	for _, p := range modulePackages(t, dir) {
		if c, ok := classify(p); ok && c == core {
			cs = append(cs, p)
		}
	}
	if len(cs) == 0 {
		t.Fatal("no core package found")
	}
	return cs
}

func TestEveryPackageIsClassified(t *testing.T) {
	dir := moduleRoot(t)
	var missing []string
	seen := map[class]bool{}
	for _, p := range modulePackages(t, dir) {
		c, ok := classify(p)
		if !ok {
			missing = append(missing, strings.TrimPrefix(p, module+"/"))
			continue
		}
		seen[c] = true
	}
	for _, m := range missing {
		t.Errorf("package %s: its top-level directory is not classified in internal/layout (topLevel): say whether it is core, an implementation, the composition root or test-only", m)
	}
	// The classification is not vacuous: the module has each side.
	for _, c := range []class{core, implementation, root, testOnly} {
		if !seen[c] {
			t.Errorf("no package of class %d: is topLevel out of date?", c)
		}
	}
}

// listed is one package of go list -deps -json.
type listed struct {
	ImportPath string
	Imports    []string
}

// TestCoreImportsNoHypervisor: no core package depends, directly or
// through others, on a hypervisor implementation. go list reads the
// production imports only (never a _test.go file's).
func TestCoreImportsNoHypervisor(t *testing.T) {
	dir := moduleRoot(t)
	cores := corePackages(t, dir)
	out := goList(t, dir, append([]string{"-e", "-deps", "-json=ImportPath,Imports"}, cores...)...)
	graph := map[string][]string{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list -json: %v", err)
		}
		graph[p.ImportPath] = p.Imports
	}
	// One problem per core package that imports an implementation
	// itself, naming the core packages that depend on it through it.
	via := map[[2]string][]string{}
	for _, c := range cores {
		for _, chain := range implChains(graph, c) {
			edge := [2]string{chain[len(chain)-2], chain[len(chain)-1]}
			if c != edge[0] {
				via[edge] = append(via[edge], strings.TrimPrefix(c, module+"/"))
			} else if via[edge] == nil {
				via[edge] = []string{}
			}
		}
	}
	var problems []string
	for edge, from := range via {
		msg := fmt.Sprintf("%s: core package imports implementation %s", strings.TrimPrefix(edge[0], module+"/"), strings.TrimPrefix(edge[1], module+"/"))
		if len(from) > 0 {
			sort.Strings(from)
			msg += fmt.Sprintf(" (%s depend on it through %s)", strings.Join(from, ", "), strings.TrimPrefix(edge[0], module+"/"))
		}
		problems = append(problems, msg)
	}
	report(t, problems)
}

// implChains returns, for every implementation package reachable from
// from, one shortest import chain from from to it.
func implChains(graph map[string][]string, from string) [][]string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	var found []string
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if isImpl(p) {
			found = append(found, p)
			continue // its own imports are its business
		}
		for _, q := range graph[p] {
			if _, ok := prev[q]; !ok {
				prev[q] = p
				queue = append(queue, q)
			}
		}
	}
	sort.Strings(found)
	var chains [][]string
	for _, f := range found {
		var chain []string
		for p := f; p != ""; p = prev[p] {
			chain = append(chain, p)
		}
		slices.Reverse(chain)
		chains = append(chains, chain)
	}
	return chains
}

// hypervisorNames are the names the implementations register (every
// string literal given as Name in a plugin.Info composite literal of a
// .go file under hypervisors/, tests included: a tests-only hypervisor
// registers there too) plus knownNames.
func hypervisorNames(t *testing.T, dir string) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for _, n := range knownNames {
		names[n] = true
	}
	fset := token.NewFileSet()
	err := filepath.WalkDir(filepath.Join(dir, "hypervisors"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil // not ours to report; go vet does
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			sel, ok := lit.Type.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Info" {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "plugin" {
				return true
			}
			for _, e := range lit.Elts {
				kv, ok := e.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "Name" {
					if s, ok := stringLit(kv.Value); ok {
						names[s] = true
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatalf("read the hypervisors' names: %v", err)
	}
	return names
}

// pluginTypes are the types whose Name is a hypervisor's name:
// comparing or switching on it is branching on the kind.
var pluginTypes = map[string]bool{
	module + "/plugin.Plugin":   true,
	module + "/plugin.Resolved": true,
	module + "/plugin.Info":     true,
	module + "/planner.Plugin":  true,
}

// kindSelectors are the field and method names that hold a hypervisor's
// kind whatever their receiver.
var kindSelectors = map[string]bool{"Hypervisor": true, "Shape": true}

// TestCoreNeverAsksWhichHypervisor: no non-test file of a core package
// compares, switches on, or keys a map literal with a hypervisor's name,
// or compares or switches on its kind.
func TestCoreNeverAsksWhichHypervisor(t *testing.T) {
	dir := moduleRoot(t)
	cores := corePackages(t, dir)
	names := hypervisorNames(t, dir)
	pkgs := typeCheck(t, dir, cores)
	var problems []string
	for _, p := range pkgs {
		for _, f := range p.files {
			c := &checker{fset: p.fset, info: p.info, names: names, dir: dir}
			c.file(f)
			problems = append(problems, c.problems...)
		}
	}
	report(t, problems)
}

// checked is one core package, parsed and type-checked as far as it
// goes.
type checked struct {
	fset  *token.FileSet
	files []*ast.File
	info  *types.Info
}

// exported is one package of go list -export -deps -json.
type exported struct {
	ImportPath string
	Dir        string
	Export     string
	GoFiles    []string
	CgoFiles   []string
}

// typeCheck parses the non-test files of every package in paths and
// type-checks them against their dependencies' export data (go list
// -export). A package that does not type-check is still returned: the
// syntactic rules need no types, and the typed one uses what resolved.
func typeCheck(t *testing.T, dir string, paths []string) []checked {
	t.Helper()
	out := goList(t, dir, append([]string{"-e", "-export", "-deps", "-json=ImportPath,Dir,Export,GoFiles,CgoFiles"}, paths...)...)
	byPath := map[string]exported{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p exported
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list -json: %v", err)
		}
		byPath[p.ImportPath] = p
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		p, ok := byPath[path]
		if !ok || p.Export == "" {
			return nil, fmt.Errorf("no export data for %s (does it compile?)", path)
		}
		return os.Open(p.Export)
	})
	var pkgs []checked
	for _, path := range paths {
		p := byPath[path]
		c := checked{fset: fset, info: newInfo()}
		for _, name := range append(slices.Clone(p.GoFiles), p.CgoFiles...) {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Errorf("parse %s: %v", filepath.Join(p.Dir, name), err)
				continue
			}
			c.files = append(c.files, f)
		}
		var first error
		conf := types.Config{Importer: imp, Error: func(err error) {
			if first == nil {
				first = err
			}
		}}
		conf.Check(path, fset, c.files, c.info) // errors are collected above
		if first != nil {
			t.Logf("note: %s does not type-check, the Name rule sees only what resolved: %v", path, first)
		}
		pkgs = append(pkgs, c)
	}
	return pkgs
}

// newInfo is the type information the checker reads.
func newInfo() *types.Info {
	return &types.Info{
		Types:      map[ast.Expr]types.TypeAndValue{},
		Selections: map[*ast.SelectorExpr]*types.Selection{},
		Defs:       map[*ast.Ident]types.Object{},
		Uses:       map[*ast.Ident]types.Object{},
	}
}

// vocabulary are the core's own declarations allowed to hold hypervisor
// names as values, each with why: a versioned format that defines them.
var vocabulary = map[string]string{
	"Hypervisors11": "jsonplan: the hypervisor names plan format 1.1 defines (a later format lets plug-ins add theirs)",
}

// checker collects one file's violations.
type checker struct {
	fset     *token.FileSet
	info     *types.Info // may be partial or nil
	names    map[string]bool
	dir      string
	problems []string
	// kinds are the variables that hold a hypervisor's kind (assigned
	// from one), so comparing them is asking which hypervisor.
	kinds map[types.Object]bool
}

func (c *checker) addf(pos token.Pos, format string, args ...any) {
	p := c.fset.Position(pos)
	file := p.Filename
	if rel, err := filepath.Rel(c.dir, file); err == nil {
		file = filepath.ToSlash(rel)
	}
	c.problems = append(c.problems, fmt.Sprintf("%s:%d: %s", file, p.Line, fmt.Sprintf(format, args...)))
}

func (c *checker) file(f *ast.File) {
	c.kinds = map[types.Object]bool{}
	c.defs(f)
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.ValueSpec:
			if len(n.Names) == 1 && vocabulary[n.Names[0].Name] != "" {
				return false
			}
		case *ast.BasicLit:
			c.literal(n)
		case *ast.BinaryExpr:
			if n.Op != token.EQL && n.Op != token.NEQ {
				return true
			}
			if !isEmpty(n.X) && !isEmpty(n.Y) {
				c.kind(n.X, n.Op.String())
				c.kind(n.Y, n.Op.String())
			}
		case *ast.SwitchStmt:
			if n.Tag != nil {
				c.kind(n.Tag, "switch")
			}
			for _, s := range n.Body.List {
				if cc, ok := s.(*ast.CaseClause); ok {
					for _, e := range cc.List {
						c.kind(e, "case")
					}
				}
			}
		}
		return true
	})
}

// defs records the variables a kind is assigned to (k := cfg.Hypervisor,
// var k = p.Name()), so a later comparison of k counts as one of the
// kind itself.
func (c *checker) defs(f *ast.File) {
	if c.info == nil {
		return
	}
	mark := func(lhs []ast.Expr, rhs []ast.Expr) {
		if len(lhs) != len(rhs) {
			return
		}
		for i, l := range lhs {
			id, ok := l.(*ast.Ident)
			if !ok || !c.isKind(rhs[i]) {
				continue
			}
			if o := c.info.Defs[id]; o != nil {
				c.kinds[o] = true
			} else if o := c.info.Uses[id]; o != nil {
				c.kinds[o] = true
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			mark(n.Lhs, n.Rhs)
		case *ast.ValueSpec:
			lhs := make([]ast.Expr, len(n.Names))
			for i, id := range n.Names {
				lhs[i] = id
			}
			mark(lhs, n.Values)
		}
		return true
	})
}

// literal reports e if it is a string literal naming a hypervisor, in
// any case (Libvirt, PROXMOX): wherever it stands in core code, as a
// comparison's operand, a case, a map key or value, a constant, a
// variable's value or a call's argument, it can only serve to pick one
// hypervisor. Messages and help that mention hypervisors are longer
// strings and do not count; declarations in vocabulary are skipped.
func (c *checker) literal(e ast.Expr) {
	if s, ok := stringLit(e); ok && c.names[strings.ToLower(s)] {
		c.addf(e.Pos(), "literal %q names a hypervisor", s)
	}
}

// kind reports e (an operand of a comparison, a switch tag or a case) if
// it reads a hypervisor's kind: a selector named Hypervisor or Shape, or
// the Name of a plug-in value; through parentheses, conversions and the
// call of such a method.
func (c *checker) kind(e ast.Expr, how string) {
	e = ast.Unparen(e)
	if id, ok := e.(*ast.Ident); ok && c.info != nil {
		if o := c.info.Uses[id]; o != nil && c.kinds[o] {
			c.addf(id.Pos(), "%s on %s, which holds a hypervisor's kind: the core asks which hypervisor it serves", how, id.Name)
		}
		return
	}
	if call, ok := e.(*ast.CallExpr); ok {
		if len(call.Args) == 1 && c.isType(call.Fun) {
			c.kind(call.Args[0], how)
			return
		}
		if len(call.Args) == 0 {
			e = ast.Unparen(call.Fun)
		}
	}
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return
	}
	if kindSelectors[sel.Sel.Name] {
		c.addf(sel.Pos(), "%s on %s: the core asks which hypervisor it serves", how, render(sel))
		return
	}
	if sel.Sel.Name == "Name" && c.info != nil {
		if s, ok := c.info.Selections[sel]; ok && pluginTypes[typeName(s.Recv())] {
			c.addf(sel.Pos(), "%s on %s, the name of a %s: the core asks which hypervisor it serves", how, render(sel), typeName(s.Recv()))
		}
	}
}

// isKind reports whether e reads a hypervisor's kind (what kind reports).
func (c *checker) isKind(e ast.Expr) bool {
	probe := &checker{fset: c.fset, info: c.info, names: c.names, dir: c.dir, kinds: c.kinds}
	probe.kind(e, "")
	return len(probe.problems) > 0
}

// isType reports whether e denotes a type (a conversion's function).
func (c *checker) isType(e ast.Expr) bool {
	if c.info != nil {
		if tv, ok := c.info.Types[e]; ok {
			return tv.IsType()
		}
	}
	id, ok := e.(*ast.Ident)
	return ok && id.Name == "string"
}

// typeName is the package-qualified name of t or of what it points to.
func typeName(t types.Type) string {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	if n, ok := t.(*types.Named); ok && n.Obj().Pkg() != nil {
		return n.Obj().Pkg().Path() + "." + n.Obj().Name()
	}
	return t.String()
}

// stringLit is e's value if it is a string literal.
func stringLit(e ast.Expr) (string, bool) {
	lit, ok := ast.Unparen(e).(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// isEmpty reports whether e is "" or nil: a presence check, not a
// question about the kind.
func isEmpty(e ast.Expr) bool {
	if s, ok := stringLit(e); ok {
		return s == ""
	}
	id, ok := ast.Unparen(e).(*ast.Ident)
	return ok && id.Name == "nil"
}

// render prints a selector as written (cfg.Hypervisor).
func render(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return render(e.X) + "." + e.Sel.Name
	case *ast.CallExpr:
		return render(e.Fun) + "()"
	case *ast.ParenExpr:
		return "(" + render(e.X) + ")"
	}
	return "…"
}

// report fails t with every problem, sorted and deduplicated, at once.
func report(t *testing.T, problems []string) {
	t.Helper()
	sort.Strings(problems)
	problems = slices.Compact(problems)
	if len(problems) > 0 {
		t.Errorf("%d violation(s) of the house rules (docs/architecture.md):\n%s", len(problems), strings.Join(problems, "\n"))
	}
}

// TestCheckerIsPrecise pins what the kind rule counts: comparisons,
// switches, cases, map keys and constants; never a comment, a message, a
// flag's help or a presence check.
func TestCheckerIsPrecise(t *testing.T) {
	tests := []struct {
		name, src string
		want      []string
	}{
		{"comparison with a name", `func f(s string) bool { return s == "proxmox" }`, []string{`x.go:3: literal "proxmox" names a hypervisor`}},
		{"a name in another case", `func f(s string) bool { return s == "Libvirt" || s == "PROXMOX" }`,
			[]string{`x.go:3: literal "Libvirt" names a hypervisor`, `x.go:3: literal "PROXMOX" names a hypervisor`}},
		{"a name as a call's argument", `func f(get func(string) int) int { return get("proxmox") }`, []string{`x.go:3: literal "proxmox" names a hypervisor`}},
		{"a name in a variable", `var which = "mem"; func f(s string) bool { return s == which }`, []string{`x.go:3: literal "mem" names a hypervisor`}},
		{"a name as a map value", `var v = map[string]string{"default": "libvirt"}`, []string{`x.go:3: literal "libvirt" names a hypervisor`}},
		{"a kind through a variable", `type c struct{ Hypervisor string }; func f(x c, y string) bool { k := x.Hypervisor; return k == y }`,
			[]string{`x.go:3: == on k, which holds a hypervisor's kind: the core asks which hypervisor it serves`}},
		{"a kind switched through a variable", `type c struct{ Hypervisor string }; func f(x c) { var k = x.Hypervisor; switch k {} }`,
			[]string{`x.go:3: switch on k, which holds a hypervisor's kind: the core asks which hypervisor it serves`}},
		{"a format's own vocabulary", `var Hypervisors11 = []string{"libvirt", "proxmox"}`, nil},
		{"a registry looked up by a kind", `type c struct{ Hypervisor string }; func f(x c, reg map[string]int) int { return reg[x.Hypervisor] }`, nil},
		{"case", `func f(s string) { switch s { case "a", "libvirt": } }`, []string{`x.go:3: literal "libvirt" names a hypervisor`}},
		{"map key", `var m = map[string]int{"mem": 1, "other": 2}`, []string{`x.go:3: literal "mem" names a hypervisor`}},
		{"constant", `const def = "libvirt"`, []string{`x.go:3: literal "libvirt" names a hypervisor`}},
		{"kind selector compared", `type c struct{ Hypervisor string }; func f(x c, y string) bool { return x.Hypervisor != y }`,
			[]string{`x.go:3: != on x.Hypervisor: the core asks which hypervisor it serves`}},
		{"kind selector switched", `type c struct{ Hypervisor string }; func f(x c) { switch x.Hypervisor {} }`,
			[]string{`x.go:3: switch on x.Hypervisor: the core asks which hypervisor it serves`}},
		{"kind method through a conversion", `type h struct{}; func (h) Shape() int { return 0 }; func f(x h, y string) bool { return string(rune(x.Shape())) == y }`,
			[]string{`x.go:3: == on x.Shape: the core asks which hypervisor it serves`}},
		{"presence check", `type c struct{ Hypervisor string }; func f(x c) bool { return x.Hypervisor == "" }`, nil},
		{"comment, message, help", "// libvirt and proxmox\n" +
			`func f(g func(string, string) error) error { return g("hypervisor", "libvirt or proxmox") }`, nil},
		{"a kind passed on, not compared", `type c struct{ Hypervisor string }; func f(x c, g func(string)) { k := x.Hypervisor; g(k) }`, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, "x.go", "package x\n\n"+tc.src+"\n", parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			info := newInfo()
			if _, err := (&types.Config{}).Check("x", fset, []*ast.File{f}, info); err != nil {
				t.Fatal(err)
			}
			c := &checker{fset: fset, info: info, names: map[string]bool{"libvirt": true, "proxmox": true, "mem": true}, dir: "."}
			c.file(f)
			if diff := cmp.Diff(tc.want, c.problems); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
		})
	}
}
