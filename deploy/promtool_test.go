package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// promtool finds Debian's promtool (scripts/prometheus.sh installs the
// prometheus package; make deploy-test runs it). Outside CI a machine
// without it skips; under CI=true it is a failure.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("promtool not found (CI=true): make deploy-test installs Debian's prometheus package: %v", err)
		}
		t.Skipf("promtool not found; run `bash scripts/prometheus.sh` as root (Debian's prometheus package) or make deploy-test: %v", err)
	}
	return p
}

// ruleTests is the part of a promtool unit-test file this test reads.
type ruleTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		Name       string `json:"name"`
		AlertTests []struct {
			Alertname string `json:"alertname"`
			EvalTime  string `json:"eval_time"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// TestAlertRulesPromtool runs Debian's promtool on the shipped rules:
// check rules (syntax, as Prometheus loads them) and test rules
// (alerts_test.yaml). Every rule must have a case where it fires and one
// where it does not.
func TestAlertRulesPromtool(t *testing.T) {
	bin := promtool(t)
	rules := filepath.Join(chartDir, "files", "alerts.yaml")
	if out, err := exec.Command(bin, "check", "rules", rules).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "test", "rules", "alerts_test.yaml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules alerts_test.yaml: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "SUCCESS") {
		t.Fatalf("promtool test rules did not report SUCCESS:\n%s", out)
	}

	var groups struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
			} `json:"rules"`
		} `json:"groups"`
	}
	b, err := os.ReadFile(rules)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &groups); err != nil {
		t.Fatal(err)
	}
	var tests ruleTests
	if b, err = os.ReadFile("alerts_test.yaml"); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &tests); err != nil {
		t.Fatal(err)
	}
	if len(tests.RuleFiles) != 1 || filepath.Clean(tests.RuleFiles[0]) != rules {
		t.Errorf("alerts_test.yaml tests %v, want %s", tests.RuleFiles, rules)
	}
	fires, quiet := map[string]int{}, map[string]int{}
	cases := 0
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertTests {
			cases++
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname]++
			} else {
				quiet[a.Alertname]++
			}
		}
	}
	var names []string
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			names = append(names, r.Alert)
			if fires[r.Alert] == 0 || quiet[r.Alert] == 0 {
				t.Errorf("rule %s: %d cases where it fires, %d where it does not; want both", r.Alert, fires[r.Alert], quiet[r.Alert])
			}
		}
	}
	sort.Strings(names)
	t.Logf("promtool test rules: %d rules, %d test groups, %d alert evaluations: SUCCESS", len(names), len(tests.Tests), cases)
}
