package deploy_test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/cli/values"
)

// docPages are the pages whose chart values snippets are rendered.
var docPages = []string{"../docs/install.md", "../docs/high-availability.md"}

// docValues is a ```yaml {chart-values ...} block of a page: a values
// file the page names (name=FILE), or a snippet the page says goes on top
// of one (on=FILE), optionally with --set-file values it says to add
// (set-file=KEY).
type docValues struct {
	page, text          string
	line                int
	name, on, setFileOf string
}

var (
	docFenceRE = regexp.MustCompile("^```(.*)$")
	chartAttrs = regexp.MustCompile(`^yaml \{chart-values((?: [a-z-]+=[^ }]+)+)\}$`)
)

func docValuesBlocks(t *testing.T) []docValues {
	t.Helper()
	var out []docValues
	for _, page := range docPages {
		f, err := os.Open(page)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		var cur *docValues
		inBlock := false
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			m := docFenceRE.FindStringSubmatch(line)
			switch {
			case m != nil && !inBlock:
				inBlock = true
				if a := chartAttrs.FindStringSubmatch(strings.TrimSpace(m[1])); a != nil {
					cur = &docValues{page: page, line: n}
					for _, kv := range strings.Fields(a[1]) {
						k, v, _ := strings.Cut(kv, "=")
						switch k {
						case "name":
							cur.name = v
						case "on":
							cur.on = v
						case "set-file":
							cur.setFileOf = v
						default:
							t.Fatalf("%s:%d: unknown chart-values attribute %q", page, n, k)
						}
					}
				}
			case m != nil && inBlock && m[1] == "":
				inBlock = false
				if cur != nil {
					out = append(out, *cur)
					cur = nil
				}
			case cur != nil:
				cur.text += line + "\n"
			}
		}
		f.Close()
	}
	return out
}

// TestDocsValuesRender renders every chart values snippet of the docs as
// written: a values file alone, a snippet on top of the values file the
// page says it goes on (issue 18: the HA snippet on top of the install
// page's dc1.values.yaml failed with "state.persistence.enabled needs
// state.enabled"), and runs config.Parse on the rendered arguments of
// each, with the pod's files laid out. docs/docs_test.go makes sure no
// chart values snippet lacks its {chart-values} marker.
func TestDocsValuesRender(t *testing.T) {
	fx := newFixtures(t)
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, []byte(fx.caPEM), 0o600); err != nil {
		t.Fatal(err)
	}
	blocks := docValuesBlocks(t)
	named := map[string]string{}
	for i, b := range blocks {
		if b.name != "" {
			p := filepath.Join(dir, fmt.Sprintf("%d-%s", i, b.name))
			if err := os.WriteFile(p, []byte(b.text), 0o600); err != nil {
				t.Fatal(err)
			}
			named[b.name] = p
		}
	}
	var ons int
	for i, b := range blocks {
		t.Run(fmt.Sprintf("%s:%d", filepath.Base(b.page), b.line), func(t *testing.T) {
			files := []string{named[b.name]}
			if b.on != "" {
				ons++
				base, ok := named[b.on]
				if !ok {
					t.Fatalf("the snippet goes on %s, which no page shows", b.on)
				}
				p := filepath.Join(dir, fmt.Sprintf("%d-snippet.yaml", i))
				if err := os.WriteFile(p, []byte(b.text), 0o600); err != nil {
					t.Fatal(err)
				}
				files = []string{base, p}
			}
			var opts values.Options
			if b.setFileOf != "" {
				opts.FileValues = []string{b.setFileOf + "=" + caFile}
			}
			r, err := renderWith("bigfleet-libvirt-dc1", "bigfleet", files, opts)
			if err != nil {
				t.Fatalf("%s:%d does not render as written: %v", b.page, b.line, err)
			}
			if _, err := parseArgs(materialise(t, r, fx)); err != nil {
				t.Fatalf("%s:%d renders arguments the provider refuses: %v", b.page, b.line, err)
			}
		})
	}
	if len(blocks) < 4 || ons < 2 {
		t.Errorf("%d chart values snippets, %d on top of another; the pages lost their examples", len(blocks), ons)
	}
	// The chart tests' dc1 values are the install page's, verbatim.
	want, err := os.ReadFile(filepath.Join("testdata", "values", "dc1.values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(named["dc1.values.yaml"])
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimPrefix(string(want), "# The minimal dc1.values.yaml of the install & deploy page, verbatim.\n") != string(got) {
		t.Errorf("testdata/values/dc1.values.yaml is not the install page's dc1.values.yaml verbatim")
	}
}
