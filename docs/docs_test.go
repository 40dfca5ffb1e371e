package docs_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox"
	"github.com/bigfleet-vm/provider/internal/providertest"
	"github.com/bigfleet-vm/provider/plugin"
)

// binDir holds the provider binary as "provider", for PATH.
var binDir string

func TestMain(m *testing.M) {
	binary, cleanup, err := providertest.Build("docs-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = filepath.Dir(binary)
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// pages are the operator pages every seed topic maps to.
var pages = []string{"install.md", "configuration-libvirt.md", "configuration-proxmox.md", "security.md", "host-setup.md"}

// block is one fenced code block.
type block struct {
	page, info, text string
	line             int
}

var fenceRE = regexp.MustCompile("^```(.*)$")

func blocks(t *testing.T, page string) []block {
	t.Helper()
	f, err := os.Open(page)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []block
	var cur *block
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		m := fenceRE.FindStringSubmatch(line)
		switch {
		case m != nil && cur == nil:
			cur = &block{page: page, info: strings.TrimSpace(m[1]), line: n}
		case m != nil && cur != nil && m[1] == "":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		}
	}
	if cur != nil {
		t.Fatalf("%s:%d: unterminated code block", page, cur.line)
	}
	return out
}

// freePort returns a loopback port nobody listens on right now, outside
// the ephemeral range.
func freePort(t *testing.T) string {
	t.Helper()
	_, p, _ := net.SplitHostPort(providertest.FreeAddr(t))
	return p
}

var portRE = map[string]*regexp.Regexp{"9000": regexp.MustCompile(`\b9000\b`), "9090": regexp.MustCompile(`\b9090\b`)}

// TestRunnableBlocks runs every ```sh {runnable} block of the operator
// pages with bash -euo pipefail in a scratch directory, the built provider
// first on PATH and the documented ports 9000 and 9090 moved to free ones
// (the machine is shared). Background processes a block starts are killed
// with its process group.
func TestRunnableBlocks(t *testing.T) {
	for _, tool := range []string{"bash", "curl", "openssl", "ssh-keygen"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed by the runnable documentation blocks: %v", tool, err)
		}
	}
	n := 0
	for _, page := range pages {
		for _, b := range blocks(t, page) {
			if b.info != "sh {runnable}" {
				continue
			}
			n++
			t.Run(fmt.Sprintf("%s:%d", page, b.line), func(t *testing.T) {
				script := b.text
				for _, p := range []string{"9000", "9090"} {
					script = portRE[p].ReplaceAllString(script, freePort(t))
				}
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				defer cancel()
				cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
				cmd.Dir = t.TempDir()
				cmd.Env = append(os.Environ(), "PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"))
				cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
				cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
				// A file, not a pipe: background processes keep their
				// output descriptors open after bash exits.
				outFile, err := os.Create(filepath.Join(t.TempDir(), "output"))
				if err != nil {
					t.Fatal(err)
				}
				defer outFile.Close()
				cmd.Stdout, cmd.Stderr = outFile, outFile
				err = cmd.Run()
				// Whatever the block left running in the background.
				if cmd.Process != nil {
					syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
					time.Sleep(200 * time.Millisecond)
					syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				}
				out, _ := os.ReadFile(outFile.Name())
				if err != nil {
					t.Fatalf("%s:%d: %v\n--- script\n%s--- output\n%s", page, b.line, err, script, out)
				}
				t.Logf("output:\n%s", out)
			})
		}
	}
	if n < 6 {
		t.Errorf("only %d runnable blocks; the pages lost their examples", n)
	}
}

// helpFlag is one flag as `provider serve -h` prints it.
type helpFlag struct {
	group, def string
}

var (
	helpFlagRE  = regexp.MustCompile(`^  --([a-z0-9-]+)`)
	helpGroupRE = regexp.MustCompile(`^([A-Za-z].*):$`)
	helpDefRE   = regexp.MustCompile(`\(default ([^()]*)\)$`)
)

// serveHelp runs `provider serve -h` and parses its flags.
func serveHelp(t *testing.T) map[string]helpFlag {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "provider"), "serve", "-h")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = cmd.Run() // -h exits non-zero; the output is what matters
	flags := map[string]helpFlag{}
	group, name := "", ""
	for _, line := range strings.Split(out.String(), "\n") {
		if m := helpGroupRE.FindStringSubmatch(line); m != nil {
			group = m[1]
			continue
		}
		if m := helpFlagRE.FindStringSubmatch(line); m != nil {
			name = m[1]
			flags[name] = helpFlag{group: group}
			continue
		}
		if name != "" && strings.HasPrefix(line, "        ") {
			if m := helpDefRE.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
				f := flags[name]
				f.def = m[1]
				flags[name] = f
			}
		}
	}
	if len(flags) < 40 {
		t.Fatalf("parsed only %d flags from serve -h:\n%s", len(flags), out.String())
	}
	return flags
}

// docRow is one row of a documentation flag table.
type docRow struct {
	flag, def string
	line      int
}

var docFlagRE = regexp.MustCompile("`--([a-z0-9-]+)`")

// flagTables returns the rows of every table whose first header cell is
// "Flag".
func flagTables(t *testing.T, page string) []docRow {
	t.Helper()
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	var rows []docRow
	in := false
	for i, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "|") {
			in = false
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for j := range cells {
			cells[j] = strings.TrimSpace(cells[j])
		}
		if cells[0] == "Flag" {
			in = true
			continue
		}
		if !in || strings.HasPrefix(cells[0], "---") || len(cells) < 2 {
			continue
		}
		for _, m := range docFlagRE.FindAllStringSubmatch(cells[0], -1) {
			rows = append(rows, docRow{flag: m[1], def: cells[1], line: i + 1})
		}
	}
	return rows
}

// resolved returns the defaults serve -h cannot print because they depend
// on the hypervisor, as config resolves them.
func resolved(t *testing.T, hypervisor string) map[string]string {
	t.Helper()
	cfg, err := config.Parse(plugin.MustRegistry(libvirt.Plugin(), proxmox.Plugin()), []string{"--use-fake-backend", "--hypervisor=" + hypervisor}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		"provider":          cfg.Provider,
		"default-zone":      strings.TrimSuffix(cfg.Zones[0], "-a"),
		"create-timeout":    cfg.Timeouts.Create.String(),
		"configure-timeout": cfg.Timeouts.Configure.String(),
		"drain-timeout":     cfg.Timeouts.Drain.String(),
		"delete-timeout":    cfg.Timeouts.Delete.String(),
	}
}

// sameDefault compares a documented default with the binary's.
func sameDefault(doc, bin string) bool {
	doc = strings.Trim(doc, "`")
	if doc == bin {
		return true
	}
	if bin == "" && (doc == "0" || doc == "false") {
		return true // serve -h omits zero defaults
	}
	if a, err := time.ParseDuration(doc); err == nil {
		if b, err := time.ParseDuration(bin); err == nil {
			return a == b
		}
	}
	if a, err := strconv.ParseFloat(doc, 64); err == nil {
		if b, err := strconv.ParseFloat(bin, 64); err == nil {
			return a == b
		}
	}
	return false
}

// TestFlagTables checks every flag table against `provider serve -h`: each
// documented flag exists with the binary's default, and each configuration
// page lists every flag of its hypervisor.
func TestFlagTables(t *testing.T) {
	help := serveHelp(t)
	hv := map[string]string{"configuration-proxmox.md": "proxmox"}
	otherGroup := map[string]string{"libvirt": "Proxmox connection and clone parameters", "proxmox": "libvirt connection and launch parameters"}
	for _, page := range pages {
		h := hv[page]
		if h == "" {
			h = "libvirt"
		}
		res := resolved(t, h)
		rows := flagTables(t, page)
		listed := map[string]bool{}
		for _, r := range rows {
			listed[r.flag] = true
			f, ok := help[r.flag]
			if !ok {
				t.Errorf("%s:%d: --%s is documented but `provider serve -h` has no such flag", page, r.line, r.flag)
				continue
			}
			switch {
			case strings.HasPrefix(r.def, "("):
				// Descriptive: the binary has no fixed default to print.
				if f.def != "" {
					t.Errorf("%s:%d: --%s default documented as %s, but serve -h says %q", page, r.line, r.flag, r.def, f.def)
				}
			case f.def == "" && res[r.flag] != "":
				if !sameDefault(r.def, res[r.flag]) {
					t.Errorf("%s:%d: --%s default documented as %s, but a %s provider resolves it to %q", page, r.line, r.flag, r.def, h, res[r.flag])
				}
			case !sameDefault(r.def, f.def):
				t.Errorf("%s:%d: --%s default documented as %s, but serve -h says %q", page, r.line, r.flag, r.def, f.def)
			}
		}
		if !strings.HasPrefix(page, "configuration-") {
			continue
		}
		var missing, foreign []string
		for name, f := range help {
			switch {
			case f.group == otherGroup[h] && listed[name]:
				foreign = append(foreign, name)
			case f.group != otherGroup[h] && !listed[name]:
				missing = append(missing, name)
			}
		}
		sort.Strings(missing)
		sort.Strings(foreign)
		if len(missing) > 0 {
			t.Errorf("%s does not document these flags of `provider serve -h`: %v", page, missing)
		}
		if len(foreign) > 0 {
			t.Errorf("%s documents flags of the other hypervisor: %v", page, foreign)
		}
	}
}

// TestProxmoxPrivileges checks the token privileges security.md documents
// and the pveum commands host-setup.md gives against the preflight's
// RequiredPrivileges, for PVE 8 and 9, pool bigfleet and template 9000.
func TestProxmoxPrivileges(t *testing.T) {
	want := map[int]map[string][]string{}
	for _, major := range []int{8, 9} {
		want[major] = sortedPrivs(proxmox.RequiredPrivileges(major, "bigfleet", "", []int{9000}))
	}

	// security.md: | Path | Privileges (PVE 9) | Privileges (PVE 8) |
	b, err := os.ReadFile("security.md")
	if err != nil {
		t.Fatal(err)
	}
	got := map[int]map[string][]string{8: {}, 9: {}}
	in := false
	tick := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "| Path | Privileges (PVE 9) | Privileges (PVE 8) |") {
			in = true
			continue
		}
		if !in || strings.HasPrefix(line, "|---") {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		path := strings.Trim(strings.TrimSpace(cells[0]), "`")
		for i, major := range []int{9, 8} {
			for _, m := range tick.FindAllStringSubmatch(cells[i+1], -1) {
				got[major][path] = append(got[major][path], m[1])
			}
		}
	}
	for _, major := range []int{8, 9} {
		if diff := cmp.Diff(want[major], sortedPrivs(got[major])); diff != "" {
			t.Errorf("security.md privileges for PVE %d differ from the preflight (-preflight +docs):\n%s", major, diff)
		}
	}

	// host-setup.md: roles and ACLs in the {pve9} block, the VM role
	// redefined in the {pve8} block.
	roles := map[int]map[string][]string{8: {}, 9: {}}
	acls := map[string]string{}
	roleRE := regexp.MustCompile(`pveum role add (\S+) --privs "([^"]+)"`)
	aclRE := regexp.MustCompile(`pveum acl modify (\S+) .*--roles (\S+)`)
	for _, bl := range blocks(t, "host-setup.md") {
		major := map[string]int{"sh {pve9}": 9, "sh {pve8}": 8}[bl.info]
		if major == 0 {
			continue
		}
		for _, m := range roleRE.FindAllStringSubmatch(bl.text, -1) {
			roles[major][m[1]] = strings.Split(m[2], ",")
		}
		for _, m := range aclRE.FindAllStringSubmatch(bl.text, -1) {
			if major != 9 {
				t.Errorf("host-setup.md: ACLs belong in the {pve9} block")
			}
			acls[m[1]] = m[2]
		}
		if strings.Contains(bl.text, "--privsep 0") {
			t.Error("host-setup.md: the token must use privilege separation")
		}
	}
	for _, major := range []int{8, 9} {
		granted := map[string][]string{}
		for path, role := range acls {
			privs, ok := roles[major][role]
			if !ok {
				privs = roles[9][role] // PVE 8 keeps the roles it does not redefine
			}
			granted[path] = privs
		}
		if diff := cmp.Diff(want[major], sortedPrivs(granted)); diff != "" {
			t.Errorf("host-setup.md grants for PVE %d differ from the preflight (-preflight +docs):\n%s", major, diff)
		}
	}
}

func sortedPrivs(m map[string][]string) map[string][]string {
	out := map[string][]string{}
	for k, v := range m {
		s := append([]string(nil), v...)
		sort.Strings(s)
		out[k] = s
	}
	return out
}

// TestPagesLinked checks that the operator pages exist and that every
// relative link between docs points at a page that exists.
func TestPagesLinked(t *testing.T) {
	linkRE := regexp.MustCompile(`\]\(([a-z0-9-]+\.md)(#[a-z0-9-]+)?\)`)
	files, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	exists := map[string]bool{}
	for _, f := range files {
		exists[f] = true
	}
	for _, p := range append(pages, "high-availability.md", "operations.md", "drift.md", "plan-format.md", "libvirt-connections.md") {
		if !exists[p] {
			t.Errorf("%s is missing", p)
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range linkRE.FindAllStringSubmatch(string(b), -1) {
			if !exists[m[1]] {
				t.Errorf("%s links to %s, which does not exist", f, m[1])
			}
		}
	}
}

// TestEveryPackageHasDocGo keeps the house rule that each package says
// what it is for in a doc.go of its own.
func TestEveryPackageHasDocGo(t *testing.T) {
	dirs := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".") && path != "..") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			dirs[filepath.Dir(path)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 20 {
		t.Fatalf("found only %d packages; the walk is wrong", len(dirs))
	}
	for dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, "doc.go")); err != nil {
			t.Errorf("package %s has no doc.go", dir)
		}
	}
}

// valuesPages are the pages whose chart values snippets
// deploy/docs_test.go renders (its docPages).
var valuesPages = []string{"install.md", "high-availability.md"}

// TestChartValuesSnippetsMarked: every yaml block of the docs that is
// Helm values for the chart (its top-level keys are the chart's) carries
// a {chart-values name=FILE} or {chart-values on=FILE} marker, and sits on
// a page deploy/docs_test.go renders, so each snippet is rendered as
// written on top of the values file the page says to start from and its
// arguments run through config.Parse (make deploy-test).
func TestChartValuesSnippetsMarked(t *testing.T) {
	keyRE := regexp.MustCompile(`(?m)^([A-Za-z][A-Za-z0-9]*):`)
	b, err := os.ReadFile("../deploy/helm/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	chart := map[string]bool{}
	for _, m := range keyRE.FindAllStringSubmatch(string(b), -1) {
		chart[m[1]] = true
	}
	files, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	marked := 0
	for _, page := range append(files, "../README.md") {
		for _, bl := range blocks(t, page) {
			if !strings.HasPrefix(bl.info, "yaml") {
				continue
			}
			keys := keyRE.FindAllStringSubmatch(bl.text, -1)
			values := len(keys) > 0
			for _, k := range keys {
				values = values && chart[k[1]]
			}
			isMarked := strings.Contains(bl.info, "{chart-values ")
			switch {
			case values && !isMarked:
				t.Errorf("%s:%d: a chart values snippet without a {chart-values name=FILE} or {chart-values on=FILE} marker, so no test renders it", page, bl.line)
			case isMarked && !slices.Contains(valuesPages, page):
				t.Errorf("%s:%d: chart values on a page deploy/docs_test.go does not render (%v)", page, bl.line, valuesPages)
			case isMarked:
				marked++
			}
		}
	}
	if marked < 4 {
		t.Errorf("%d marked chart values snippets; the pages lost their examples", marked)
	}
}
