package deploy_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/internal/providertest"
	"github.com/bigfleet-vm/provider/metrics"
	"github.com/bigfleet-vm/provider/server"
)

// targetLabels are what Prometheus adds to every scraped series.
var targetLabels = []string{"job", "instance"}

// exported maps every series name the binary exposes (histograms as their
// _bucket, _sum and _count series) to its label names.
type exported map[string]map[string]bool

// gatherExported runs a real provider on the simulator, exercises it over
// gRPC until every family has samples (a reconcile pass, executed steps,
// hypervisor calls, commits, an unreachable zone), and scrapes /metrics.
func gatherExported(t *testing.T) exported {
	t.Helper()
	addrs := providertest.FreeAddrs(t, 2)
	grpcAddr, metricsAddr := addrs[0], addrs[1]
	// gRPC serves TLS so the certificate expiry gauge has a series.
	dir := t.TempDir()
	ca := newCA(t, "obs-ca")
	pair := ca.issue(t, "localhost", false)
	certFile, keyFile := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	for f, data := range map[string][]byte{certFile: pair.certPEM, keyFile: pair.keyPEM} {
		if err := os.WriteFile(f, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := config.Parse(registry, []string{"--use-fake-backend", "--installation-id", "obs", "--seed-count", "4",
		"--state", filepath.Join(dir, "state"), "--addr", grpcAddr, "--metrics-addr", metricsAddr,
		"--reconcile-interval", "1h", "--shutdown-grace", "2s", "--fake-admin", "--tls-cert", certFile, "--tls-key", keyFile,
		"--fake-host-cpus", "2", "--fake-host-memory-gib", "64"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p, err := server.Build(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		p.Close()
	})
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	cl := pb.NewCapacityProviderClient(conn)
	base := "http://" + metricsAddr

	want := []string{"bigfleet_provider_machines", "bigfleet_provider_drift", "bigfleet_provider_executor_steps_total",
		"bigfleet_provider_reconcile_duration_seconds", "bigfleet_provider_zone_last_observed_timestamp_seconds",
		"bigfleet_provider_hypervisor_calls_total", "bigfleet_provider_state_fsync_duration_seconds",
		"grpc_server_handling_seconds", "bigfleet_provider_plan_pending_steps", "bigfleet_provider_repair_failures_total",
		"bigfleet_provider_serving", "bigfleet_provider_certificate_expiry_seconds", "bigfleet_provider_zone_overcommit_ratio"}
	// Families come and go (pending steps vanish once a plan is done), so
	// what the binary exports is the union over every scrape.
	ex := exported{}
	created, stopped := false, false
	deadline := time.Now().Add(30 * time.Second)
	for {
		id := cfg.Slots[0].ID
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		if !created {
			_, err := cl.Create(cctx, &pb.CreateRequest{MachineId: id})
			created = err == nil
		} else if m, err := cl.Get(cctx, &pb.MachineRef{Id: id}); err == nil && m.GetState() == pb.MachineState_MACHINE_STATE_IDLE && !stopped {
			// Stopping its VM out of band triggers a full pass whose plan
			// has a pending start step (and stopped drift); its host times
			// Start out, so the repair runs out of attempts and is counted.
			for _, q := range []string{"/admin/flaky?op=Start&zone=" + cfg.Slots[0].Zone, "/admin/stop?machine=" + id} {
				resp, err := http.Post(base+q, "", nil)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			}
			stopped = true
		}
		ccancel()
		fams, err := scrape(base + "/metrics")
		if err == nil {
			ex.merge(toExported(fams))
		}
		missing := []string{}
		for _, w := range want {
			if ex[w] == nil && ex[w+"_bucket"] == nil {
				missing = append(missing, w)
			}
		}
		if len(missing) == 0 {
			// One more scrape with a zone down, so zone_up has both values.
			resp, err := http.Post(base+"/admin/unreachable?zone="+cfg.Zones[1], "", nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			time.Sleep(500 * time.Millisecond)
			if fams, err = scrape(base + "/metrics"); err != nil {
				t.Fatal(err)
			}
			ex.merge(toExported(fams))
			return ex
		}
		if time.Now().After(deadline) {
			t.Fatalf("families without samples after 30s: %v (%v)", missing, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func scrape(url string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	tp := expfmt.NewTextParser(model.UTF8Validation)
	return tp.TextToMetricFamilies(resp.Body)
}

func (ex exported) merge(o exported) {
	for name, labels := range o {
		if ex[name] == nil {
			ex[name] = map[string]bool{}
		}
		for l := range labels {
			ex[name][l] = true
		}
	}
}

func toExported(fams map[string]*dto.MetricFamily) exported {
	ex := exported{}
	add := func(name string, labels map[string]bool) {
		if ex[name] == nil {
			ex[name] = map[string]bool{}
		}
		for l := range labels {
			ex[name][l] = true
		}
	}
	for name, f := range fams {
		labels := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = true
			}
		}
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			withLE := map[string]bool{"le": true}
			for l := range labels {
				withLE[l] = true
			}
			add(name+"_bucket", withLE)
			add(name+"_sum", labels)
			add(name+"_count", labels)
		case dto.MetricType_SUMMARY:
			add(name+"_sum", labels)
			add(name+"_count", labels)
			labels["quantile"] = true
			add(name, labels)
		default:
			add(name, labels)
		}
	}
	return ex
}

var promql = parser.NewParser(parser.Options{})

// checkExpr parses a PromQL expression with Prometheus's own parser and
// checks every selector names an exported series with labels it has, and
// every by/on/group_left label exists on the vectors it groups or matches.
func checkExpr(ex exported, expr string) []error {
	root, err := promql.ParseExpr(expr)
	if err != nil {
		return []error{fmt.Errorf("parse: %w", err)}
	}
	var errs []error
	var labelsOf func(n parser.Node) map[string]bool
	labelsOf = func(n parser.Node) map[string]bool {
		switch n := n.(type) {
		case *parser.VectorSelector:
			out := map[string]bool{}
			for l := range ex[n.Name] {
				out[l] = true
			}
			for _, l := range targetLabels {
				out[l] = true
			}
			return out
		case *parser.MatrixSelector:
			return labelsOf(n.VectorSelector)
		case *parser.SubqueryExpr:
			return labelsOf(n.Expr)
		case *parser.ParenExpr:
			return labelsOf(n.Expr)
		case *parser.UnaryExpr:
			return labelsOf(n.Expr)
		case *parser.StepInvariantExpr:
			return labelsOf(n.Expr)
		case *parser.AggregateExpr:
			inner := labelsOf(n.Expr)
			out := map[string]bool{}
			if n.Without {
				for l := range inner {
					out[l] = !slicesContains(n.Grouping, l)
				}
			} else {
				for _, l := range n.Grouping {
					out[l] = true
				}
			}
			return out
		case *parser.Call:
			var out map[string]bool
			for _, a := range n.Args {
				if _, ok := a.(*parser.StringLiteral); ok {
					continue
				}
				if t := a.Type(); t == parser.ValueTypeVector || t == parser.ValueTypeMatrix {
					out = labelsOf(a)
					break
				}
			}
			if n.Func.Name == "histogram_quantile" && out != nil {
				delete(out, "le")
			}
			return out
		case *parser.BinaryExpr:
			l, r := labelsOf(n.LHS), labelsOf(n.RHS)
			if l == nil {
				return r
			}
			if n.Op == parser.LOR {
				for k := range r {
					l[k] = true
				}
			}
			return l
		}
		return nil
	}
	parser.Inspect(root, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			have, ok := ex[n.Name]
			if !ok {
				errs = append(errs, fmt.Errorf("metric %s is not exported by the provider", n.Name))
				return nil
			}
			for _, m := range n.LabelMatchers {
				if m.Name == model.MetricNameLabel || slicesContains(targetLabels, m.Name) {
					continue
				}
				if !have[m.Name] {
					errs = append(errs, fmt.Errorf("%s has no label %q (it has %v)", n.Name, m.Name, sortedKeys(have)))
				}
			}
		case *parser.AggregateExpr:
			inner := labelsOf(n.Expr)
			for _, g := range n.Grouping {
				if !inner[g] {
					errs = append(errs, fmt.Errorf("%s by/without (%s): label %q is not on the aggregated series (%v)", n.Op, strings.Join(n.Grouping, ", "), g, sortedKeys(inner)))
				}
			}
		case *parser.BinaryExpr:
			vm := n.VectorMatching
			if vm == nil {
				return nil
			}
			l, r := labelsOf(n.LHS), labelsOf(n.RHS)
			if vm.On {
				for _, m := range vm.MatchingLabels {
					if (l != nil && !l[m]) || (r != nil && !r[m]) {
						errs = append(errs, fmt.Errorf("on (%s): label %q is not on both sides (%v | %v)", strings.Join(vm.MatchingLabels, ", "), m, sortedKeys(l), sortedKeys(r)))
					}
				}
			}
			for _, inc := range vm.Include {
				side := r
				if vm.Card == parser.CardOneToMany {
					side = l
				}
				if !side[inc] {
					errs = append(errs, fmt.Errorf("group_left/right (%s): label %q is not on the 'one' side", strings.Join(vm.Include, ", "), inc))
				}
			}
		}
		return nil
	})
	return errs
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func sortedKeys(m map[string]bool) []string {
	out := []string{}
	for k, v := range m {
		if v {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// grafanaVars replaces the dashboard's variables with values PromQL
// accepts, as Grafana would before sending the query.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$job", ".*", "$instance", ".*")

// TestObservabilityKit checks the alert rules and the Grafana dashboard
// against the metrics a real provider exports.
func TestObservabilityKit(t *testing.T) {
	ex := gatherExported(t)
	// Series the single provider above does not export: Prometheus's own
	// up, and what only replicas of an etcd state export (taken from the
	// provider's metrics package with a follower attached; the HA suite
	// scrapes real replicas).
	ex["up"] = map[string]bool{}
	m := metrics.New(nil, nil)
	m.FollowLag(func() (float64, bool) { return 0, true })
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	haOnly := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		if f.GetName() == "bigfleet_provider_state_follow_lag_seconds" {
			haOnly[f.GetName()] = f
		}
	}
	if len(haOnly) != 1 {
		t.Fatal("the metrics package does not export bigfleet_provider_state_follow_lag_seconds with a follower")
	}
	ex.merge(toExported(haOnly))
	for _, must := range []string{"grpc_server_handled_total", "grpc_server_handling_seconds_bucket", "bigfleet_provider_build_info"} {
		if ex[must] == nil {
			t.Fatalf("the provider does not export %s", must)
		}
	}
	if diff := cmp.Diff([]string{"grpc_code", "grpc_method", "grpc_service", "grpc_type"}, sortedKeys(ex["grpc_server_handled_total"])); diff != "" {
		t.Errorf("grpc_server_handled_total labels (-want +got):\n%s", diff)
	}
	if ex["bigfleet_provider_grpc_requests_total"] != nil {
		t.Error("the hand-rolled gRPC counters are still exported next to the standard ones")
	}

	t.Run("alerts", func(t *testing.T) {
		path := filepath.Join(chartDir, "files", "alerts.yaml")
		groups, errs := rulefmt.ParseFile(path, false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler))
		for _, err := range errs {
			t.Errorf("rulefmt: %v", err)
		}
		if groups == nil {
			t.FailNow()
		}
		var names []string
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				names = append(names, r.Alert)
				for _, err := range checkExpr(ex, r.Expr) {
					t.Errorf("alert %s: %v\n%s", r.Alert, err, r.Expr)
				}
				if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
					t.Errorf("alert %s lacks a severity label or a summary", r.Alert)
				}
			}
		}
		want := []string{"BigFleetProviderDrift", "BigFleetProviderZoneDown", "BigFleetProviderZoneOverOffered", "BigFleetProviderStateStoreUnhealthy",
			"BigFleetProviderFailedMachinesRising", "BigFleetProviderObservationStale", "BigFleetProviderCertificateExpiringSoon",
			"BigFleetProviderNotServing", "BigFleetProviderTargetDown", "BigFleetProviderStandbyCannotFollow"}
		if diff := cmp.Diff(want, names); diff != "" {
			t.Errorf("alerts (-want +got):\n%s", diff)
		}
	})

	t.Run("dashboard", func(t *testing.T) {
		files, err := filepath.Glob("grafana/*.json")
		if err != nil || len(files) == 0 {
			t.Fatalf("no dashboards: %v", err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var d dashboard
			dec := json.NewDecoder(strings.NewReader(string(b)))
			if err := dec.Decode(&d); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			seen := map[string]bool{}
			n := 0
			for _, p := range d.Panels {
				for _, tg := range p.Targets {
					n++
					for _, err := range checkExpr(ex, grafanaVars.Replace(tg.Expr)) {
						t.Errorf("%s panel %q: %v\n%s", f, p.Title, err, tg.Expr)
					}
					root, _ := promql.ParseExpr(grafanaVars.Replace(tg.Expr))
					parser.Inspect(root, func(n parser.Node, _ []parser.Node) error {
						if vs, ok := n.(*parser.VectorSelector); ok {
							seen[vs.Name] = true
						}
						return nil
					})
				}
			}
			for _, v := range d.Templating.List {
				q := v.Definition
				if q == "" {
					continue
				}
				// label_values(selector, label)
				inner := strings.TrimSuffix(strings.TrimPrefix(q, "label_values("), ")")
				i := strings.LastIndex(inner, ",")
				sel, label := grafanaVars.Replace(strings.TrimSpace(inner[:i])), strings.TrimSpace(inner[i+1:])
				for _, err := range checkExpr(ex, fmt.Sprintf("count by (%s) (%s)", label, sel)) {
					t.Errorf("%s variable %s: %v", f, v.Name, err)
				}
			}
			// The panels the issue lists.
			for _, m := range []string{"bigfleet_provider_machines", "bigfleet_provider_drift", "bigfleet_provider_plan_steps",
				"bigfleet_provider_reconcile_duration_seconds_bucket", "bigfleet_provider_zone_up", "bigfleet_provider_state_fsync_duration_seconds_bucket",
				"bigfleet_provider_state_size_bytes", "grpc_server_handled_total", "grpc_server_handling_seconds_bucket"} {
				if !seen[m] {
					t.Errorf("%s has no panel on %s", f, m)
				}
			}
			// Per-host latency and per-procedure latency (issue 16).
			for _, by := range []string{"sum by (le, zone)", "sum by (le, procedure)"} {
				found := false
				for _, p := range d.Panels {
					for _, tg := range p.Targets {
						if strings.Contains(tg.Expr, by) && strings.Contains(tg.Expr, "bigfleet_provider_hypervisor_call_duration_seconds_bucket") {
							found = true
						}
					}
				}
				if !found {
					t.Errorf("%s has no panel on hypervisor_call_duration_seconds %s", f, by)
				}
			}
			// Where Creates spend their time, per zone (issue 21).
			found := false
			for _, p := range d.Panels {
				for _, tg := range p.Targets {
					if strings.Contains(tg.Expr, "sum by (zone, action)") && strings.Contains(tg.Expr, "bigfleet_provider_executor_step_duration_seconds") {
						found = true
					}
				}
			}
			if !found {
				t.Errorf("%s has no panel on executor_step_duration_seconds by zone and action", f)
			}
			t.Logf("%s: %d panels, %d queries", f, len(d.Panels), n)
		}
	})
}

type dashboard struct {
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

// TestCheckExprCatchesMistakes keeps the checker honest: each expression
// has one mistake the checker must name.
func TestCheckExprCatchesMistakes(t *testing.T) {
	ex := exported{
		"bigfleet_provider_zone_up":    {"zone": true},
		"bigfleet_provider_drift":      {"zone": true, "kind": true},
		"grpc_server_handled_total":    {"grpc_method": true, "grpc_code": true},
		"bigfleet_provider_build_info": {"version": true},
	}
	for _, tc := range []struct{ expr, want string }{
		{`bigfleet_provider_zone_upp == 0`, "not exported"},
		{`bigfleet_provider_zone_up{host="a"} == 0`, `no label "host"`},
		{`sum by (method) (grpc_server_handled_total)`, `label "method" is not on the aggregated series`},
		{`sum by (zone) (bigfleet_provider_drift) > on (instance, kind) group_left () bigfleet_provider_zone_up`, `label "kind" is not on both sides`},
		{`sum(rate(grpc_server_handled_total[5m]) by (code))`, "parse"},
	} {
		errs := checkExpr(ex, tc.expr)
		if len(errs) == 0 || !strings.Contains(fmt.Sprint(errs), tc.want) {
			t.Errorf("%s: %v, want an error mentioning %q", tc.expr, errs, tc.want)
		}
	}
	if errs := checkExpr(ex, `sum by (job, zone, kind) (bigfleet_provider_drift) > 0`); len(errs) > 0 {
		t.Errorf("a correct expression is refused: %v", errs)
	}
}
