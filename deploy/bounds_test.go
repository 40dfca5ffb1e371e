package deploy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/cli/values"

	"github.com/bigfleet-vm/provider/config"
)

// chartBound ties a chart value to the bounded provider flag it becomes
// (config.Bounds of the shipped registry: the binary's one place
// for the bounds).
type chartBound struct {
	value string   // dotted values path
	flag  string   // the flag, without "--"
	files []string // the values files a render starts from
	// zeroOmits: 0 (the chart's default) renders no flag, so the binary's
	// own default applies; the schema allows 0 besides the flag's range.
	zeroOmits bool
	// parse is what config.Parse needs besides the flag for the flag to
	// apply (an etcd state for --leader-lease).
	parse []string
}

var chartBounds = []chartBound{
	{value: "ha.leaderLease", flag: "leader-lease", files: []string{"dc1.values.yaml", "ha.values.yaml"},
		parse: []string{"--state", "etcd://127.0.0.1:2379/bounds"}},
	{value: "reconcileInterval", flag: "reconcile-interval", files: []string{"dc1.values.yaml"}},
	{value: "seedCount", flag: "seed-count", files: []string{"dc1.values.yaml"}, zeroOmits: true},
	{value: "proxmox.templateVmid", flag: "template-vmid", files: []string{"proxmox.values.yaml"}},
	{value: "pricePerVcpuHour", flag: "price-per-vcpu-hour", files: []string{"dc1.values.yaml"}},
	{value: "pricePerGibHour", flag: "price-per-gib-hour", files: []string{"dc1.values.yaml"}},
}

// durationUnits are the units a chart duration value may use, finest
// first: one integer and one unit ("90s", "2m"), so the schema can bound
// it with a pattern.
var durationUnits = []struct {
	name string
	d    time.Duration
}{{"ms", time.Millisecond}, {"s", time.Second}, {"m", time.Minute}, {"h", time.Hour}}

// durationPattern is the schema pattern of a chart duration value bounded
// by b: "0" when b allows it, else one integer in range per unit.
func durationPattern(b config.DurationBound) string {
	var alts []string
	if b.Off || b.Min == 0 {
		alts = append(alts, "0")
	}
	for _, u := range durationUnits {
		if b.Unit > 0 && u.d%b.Unit != 0 {
			continue // finer than the flag's unit
		}
		lo, hi := int64((b.Min+u.d-1)/u.d), int64(b.Max/u.d)
		lo = max(lo, 1)
		if lo > hi {
			continue
		}
		alts = append(alts, "("+rangeRegex(lo, hi)+")"+u.name)
	}
	return "^(" + strings.Join(alts, "|") + ")$"
}

// rangeRegex matches the decimal numbers lo..hi (0 < lo <= hi), without
// leading zeros.
func rangeRegex(lo, hi int64) string {
	var parts []string
	for lo <= hi {
		digits := len(strconv.FormatInt(lo, 10))
		top, _ := strconv.ParseInt(strings.Repeat("9", digits), 10, 64)
		end := min(hi, top)
		parts = append(parts, sameLength(strconv.FormatInt(lo, 10), strconv.FormatInt(end, 10)))
		lo = end + 1
	}
	return strings.Join(parts, "|")
}

// sameLength matches the digit strings a..b, which have the same length.
func sameLength(a, b string) string {
	switch {
	case a == b:
		return a
	case len(a) == 1:
		return digitClass(a[0], b[0])
	case a[0] == b[0]:
		return a[:1] + group(sameLength(a[1:], b[1:]))
	}
	rest := len(a) - 1
	zeros, nines := strings.Repeat("0", rest), strings.Repeat("9", rest)
	var alts []string
	first, last := a[0], b[0]
	if a[1:] != zeros {
		alts = append(alts, a[:1]+group(sameLength(a[1:], nines)))
		first++
	}
	var tail string
	if b[1:] != nines {
		tail = b[:1] + group(sameLength(zeros, b[1:]))
		last--
	}
	if first <= last {
		digits := "[0-9]"
		if rest > 1 {
			digits += "{" + strconv.Itoa(rest) + "}"
		}
		alts = append(alts, digitClass(first, last)+digits)
	}
	if tail != "" {
		alts = append(alts, tail)
	}
	return strings.Join(alts, "|")
}

// group parenthesises an alternation.
func group(re string) string {
	if strings.Contains(re, "|") {
		return "(" + re + ")"
	}
	return re
}

func digitClass(lo, hi byte) string {
	if lo == hi {
		return string(lo)
	}
	return "[" + string(lo) + "-" + string(hi) + "]"
}

// TestRangeRegex: the generated pattern matches exactly the numbers of
// its range, checked exhaustively on small ranges and at the edges and at
// random points of large ones.
func TestRangeRegex(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, rg := range [][2]int64{{1, 1}, {2, 60}, {1, 9}, {7, 10}, {99, 100}, {100, 999999999}, {500, 86400000}, {1, 1000000}, {250, 60000}, {13, 4071}} {
		re := regexp.MustCompile("^(" + rangeRegex(rg[0], rg[1]) + ")$")
		check := func(n int64) {
			want := n >= rg[0] && n <= rg[1]
			if got := re.MatchString(strconv.FormatInt(n, 10)); got != want {
				t.Errorf("range %v: %d matches %t, want %t (%s)", rg, n, got, want, re)
			}
		}
		if rg[1] <= 100000 {
			for n := int64(0); n <= rg[1]*10+10; n++ {
				check(n)
			}
			continue
		}
		for _, n := range []int64{0, 1, rg[0] - 1, rg[0], rg[0] + 1, rg[1] - 1, rg[1], rg[1] + 1, rg[1] * 10} {
			check(n)
		}
		for range 20000 {
			check(r.Int64N(rg[1] * 2))
		}
		if re.MatchString("0" + strconv.FormatInt(rg[0], 10)) {
			t.Errorf("range %v accepts a leading zero", rg)
		}
	}
}

// schemaNode returns the schema of a dotted values path.
func schemaNode(t *testing.T, schema map[string]any, path string) map[string]any {
	t.Helper()
	node := schema
	for _, k := range strings.Split(path, ".") {
		props, _ := node["properties"].(map[string]any)
		next, ok := props[k].(map[string]any)
		if !ok {
			t.Fatalf("values.schema.json has no %s", path)
		}
		node = next
	}
	return node
}

func loadSchema(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	return schema
}

// renderedFlagRE finds a chart value rendered into a flag in the args
// template: (printf "--flag=%s" $v.path) or ($v.path | int).
var renderedFlagRE = regexp.MustCompile(`printf "--([a-z0-9-]+)=%[a-z]" \(?\$v\.([A-Za-z.]+)`)

// TestChartSchemaCarriesTheBinaryBounds: every chart value that becomes a
// bounded flag is listed in chartBounds, and its schema carries exactly
// the binary's bounds: a duration's pattern is generated from them, an
// integer's minimum and maximum and a number's minimum are theirs.
func TestChartSchemaCarriesTheBinaryBounds(t *testing.T) {
	tpl, err := os.ReadFile(filepath.Join(chartDir, "templates", "_helpers.tpl"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]string{}
	for _, b := range chartBounds {
		listed[b.flag] = b.value
	}
	for _, m := range renderedFlagRE.FindAllStringSubmatch(string(tpl), -1) {
		flag, path := m[1], m[2]
		_, d := durationBounds[flag]
		_, i := intBounds[flag]
		_, f := floatBounds[flag]
		if (d || i || f) && listed[flag] != path {
			t.Errorf("the chart renders %s into bounded --%s, which chartBounds does not list", path, flag)
		}
	}
	schema := loadSchema(t)
	for _, b := range chartBounds {
		node := schemaNode(t, schema, b.value)
		if db, ok := durationBounds[b.flag]; ok {
			if want := durationPattern(db); node["pattern"] != want {
				t.Errorf("%s (--%s %s..%s): schema pattern\n  %v\nwant\n  %q", b.value, b.flag, db.Min, db.Max, node["pattern"], want)
			}
			continue
		}
		if ib, ok := intBounds[b.flag]; ok {
			lo := float64(ib.Min)
			if b.zeroOmits {
				lo = 0
			}
			if node["minimum"] != lo || node["maximum"] != float64(ib.Max) {
				t.Errorf("%s (--%s %d..%d): schema minimum %v maximum %v, want %v and %d", b.value, b.flag, ib.Min, ib.Max, node["minimum"], node["maximum"], lo, ib.Max)
			}
			continue
		}
		fb, ok := floatBounds[b.flag]
		if !ok {
			t.Errorf("--%s has no bound in config", b.flag)
			continue
		}
		// A number, or "" for the binary's default.
		alts, _ := node["anyOf"].([]any)
		if len(alts) == 0 {
			t.Errorf("%s: schema has no anyOf", b.value)
			continue
		}
		num := alts[0].(map[string]any)
		if num["type"] != "number" || num["minimum"] != fb.Min {
			t.Errorf("%s (--%s >= %v): schema %v", b.value, b.flag, fb.Min, num)
		}
		if mx, ok := num["maximum"]; ok && mx != fb.Max {
			t.Errorf("%s: schema maximum %v, binary %v", b.value, mx, fb.Max)
		}
	}
}

// boundCase is one value rendered at a bound.
type boundCase struct {
	json   string // the value as --set-json gives it
	arg    string // what the flag is rendered as ("" when the chart omits it)
	inside bool
}

// cases are the values just inside and just outside b's bounds.
func (b chartBound) cases(t *testing.T) []boundCase {
	t.Helper()
	str := func(s string) string { return strconv.Quote(s) }
	if db, ok := durationBounds[b.flag]; ok {
		unit := durationUnits[0]
		if db.Unit > 0 {
			unit = durationUnits[slices.IndexFunc(durationUnits, func(u struct {
				name string
				d    time.Duration
			}) bool {
				return u.d == db.Unit
			})]
		}
		in := func(d time.Duration) string { // in the coarsest unit that divides d
			for i := len(durationUnits) - 1; i >= 0; i-- {
				if u := durationUnits[i]; d%u.d == 0 && u.d >= unit.d {
					return strconv.FormatInt(int64(d/u.d), 10) + u.name
				}
			}
			t.Fatalf("%s is not a whole number of %s", d, unit.name)
			return ""
		}
		fine := func(d time.Duration) string { return strconv.FormatInt(int64(d/unit.d), 10) + unit.name }
		out := []boundCase{
			{json: str(in(db.Max)), arg: in(db.Max), inside: true},
			{json: str(fine(db.Max)), arg: fine(db.Max), inside: true},
			{json: str(fine(db.Max + unit.d)), arg: fine(db.Max + unit.d)},
		}
		if db.Min > 0 {
			out = append(out, boundCase{json: str(in(db.Min)), arg: in(db.Min), inside: true},
				boundCase{json: str(fine(db.Min - unit.d)), arg: fine(db.Min - unit.d), inside: db.Off && db.Min == unit.d})
		}
		if db.Off || db.Min == 0 {
			out = append(out, boundCase{json: str("0"), arg: "0", inside: true})
		} else {
			out = append(out, boundCase{json: str("0"), arg: "0"})
		}
		if db.Unit == time.Second {
			half := db.Min + 500*time.Millisecond
			out = append(out, boundCase{json: str(fmt.Sprintf("%dms", half/time.Millisecond)), arg: fmt.Sprintf("%dms", half/time.Millisecond)})
		}
		return out
	}
	if ib, ok := intBounds[b.flag]; ok {
		out := []boundCase{
			{json: fmt.Sprint(ib.Min), arg: fmt.Sprint(ib.Min), inside: true},
			{json: fmt.Sprint(ib.Max), arg: fmt.Sprint(ib.Max), inside: true},
			{json: fmt.Sprint(ib.Max + 1), arg: fmt.Sprint(ib.Max + 1)},
		}
		if b.zeroOmits {
			out = append(out, boundCase{json: "0", inside: true}, boundCase{json: "-1", arg: "-1"})
		} else {
			out = append(out, boundCase{json: fmt.Sprint(ib.Min - 1), arg: fmt.Sprint(ib.Min - 1)})
		}
		return out
	}
	fb := floatBounds[b.flag]
	return []boundCase{
		{json: fmt.Sprint(fb.Min), arg: fmt.Sprint(fb.Min), inside: true},
		{json: "1e+06", arg: "1e+06", inside: true},
		{json: fmt.Sprint(fb.Min - 0.01), arg: fmt.Sprint(fb.Min - 0.01)},
	}
}

// TestChartBoundaryRenders renders every bounded value just inside and
// just outside its bounds. Inside, the chart renders and the provider's
// config.Parse accepts the rendered arguments; outside, the schema refuses
// the value and config.Parse refuses the same flag value: the chart can
// never pass what the binary rejects, nor reject what it accepts.
func TestChartBoundaryRenders(t *testing.T) {
	fx := newFixtures(t)
	caFile := filepath.Join(t.TempDir(), "pve-root-ca.pem")
	if err := os.WriteFile(caFile, []byte(fx.caPEM), 0o600); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, b := range chartBounds {
		for _, c := range b.cases(t) {
			n++
			t.Run(fmt.Sprintf("%s=%s", b.value, c.json), func(t *testing.T) {
				opts := values.Options{JSONValues: []string{b.value + "=" + c.json}}
				if slices.Contains(b.files, "proxmox.values.yaml") {
					opts.FileValues = []string{"proxmox.ca.content=" + caFile}
				}
				r, err := renderWith("bounds", "bigfleet", b.files, opts)
				if !c.inside {
					// The binary on the same flag value.
					var stderr bytes.Buffer
					_, perr := config.Parse(registry, append(append([]string{"--use-fake-backend"}, b.parse...), "--"+b.flag+"="+c.arg), &stderr)
					if err == nil {
						t.Errorf("the chart renders %s=%s, outside the bounds of --%s", b.value, c.json, b.flag)
					} else if !strings.Contains(err.Error(), "/"+strings.ReplaceAll(b.value, ".", "/")) {
						t.Errorf("the render fails, but not on %s: %v", b.value, err)
					}
					if perr == nil || !strings.Contains(perr.Error(), "--"+b.flag+":") {
						t.Errorf("config.Parse accepts --%s=%s, which the chart refuses: %v", b.flag, c.arg, perr)
					}
					return
				}
				if err != nil {
					t.Fatalf("the chart refuses %s=%s, inside the bounds of --%s: %v", b.value, c.json, b.flag, err)
				}
				args := r.container(t).Args
				want := "--" + b.flag + "=" + c.arg
				switch {
				case c.arg == "" && slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--"+b.flag+"=") }):
					t.Errorf("%s=%s renders --%s: %q", b.value, c.json, b.flag, args)
				case c.arg != "" && !slices.Contains(args, want):
					t.Errorf("%s=%s does not render %s: %q", b.value, c.json, want, args)
				}
				if _, err := parseArgs(materialise(t, r, fx)); err != nil {
					t.Errorf("config.Parse refuses the rendered args: %v", err)
				}
			})
		}
	}
	t.Logf("boundary matrix: %d bounded values, %d renders", len(chartBounds), n)
}
