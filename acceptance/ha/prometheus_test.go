//go:build ha

package ha

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/internal/etcdtest"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// prometheus is a real Prometheus (Debian's package; scripts/prometheus.sh
// installs it for make ha) started by the test on an ephemeral port. It
// scrapes its targets every second under job "bf" and evaluates the
// shipped alert rules (deploy/helm/files/alerts.yaml) every second; the
// test stops it.
type prometheus struct {
	url string
}

// startPrometheus starts Prometheus scraping targets (host:port of the
// providers' metrics listeners).
func startPrometheus(t *testing.T, targets []string) *prometheus {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("prometheus not found (CI=true): make ha installs Debian's prometheus package: %v", err)
		}
		t.Skipf("prometheus not found; run `bash scripts/prometheus.sh` as root: %v", err)
	}
	_, file, _, _ := runtime.Caller(0)
	rules, err := filepath.Abs(filepath.Join(filepath.Dir(file), "..", "..", "deploy", "helm", "files", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	quoted := make([]string, len(targets))
	for i, tg := range targets {
		quoted[i] = fmt.Sprintf("%q", tg)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 900ms
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: bf
    static_configs:
      - targets: [%s]
`, rules, strings.Join(quoted, ", "))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := providertest.FreeAddr(t)
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start prometheus: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("prometheus output:\n%s", tailLines(out.String(), 40))
		}
	})
	p := &prometheus{url: "http://" + addr}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(p.url + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case <-done:
			t.Fatalf("prometheus exited: %s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after 30s: %v\n%s", err, out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// sample is one element of an instant query's result.
type sample struct {
	Metric map[string]string
	Value  float64
}

// query evaluates q now through the HTTP API.
func (p *prometheus) query(t *testing.T, q string) []sample {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+"/api/v1/query?"+url.Values{"query": {q}}.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("query %s: %v", q, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil || r.Status != "success" {
		t.Fatalf("query %s: %v %s %s", q, err, r.Error, body)
	}
	out := make([]sample, 0, len(r.Data.Result))
	for _, x := range r.Data.Result {
		var v float64
		s, _ := x.Value[1].(string)
		fmt.Sscan(s, &v)
		out = append(out, sample{Metric: x.Metric, Value: v})
	}
	return out
}

// await waits until ok holds for q's result.
func (p *prometheus) await(t *testing.T, what, q string, ok func([]sample) bool) []sample {
	t.Helper()
	deadline := time.Now().Add(takeoverWait)
	for {
		r := p.query(t, q)
		if ok(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s = %+v after %v", what, q, r, takeoverWait)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestPrometheusFailover scrapes two replicas of an etcd state with a
// real Prometheus evaluating the shipped rules, and checks what an
// operator's Prometheus sees: exactly one serving replica; after a
// fail-over (the leader paused past its lease, then resumed, as in issue
// 18) only the new leader's zone series, and no ObservationStale (which
// the deposed leader's frozen observation times used to fire); with etcd's
// quorum lost both replicas stand by and report state_healthy 0, and
// NotServing goes pending; with both processes dead TargetDown and
// NotServing go pending.
func TestPrometheusFailover(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	s := startSet(t, c, "/ha/prometheus", 2, "--seed-count", "8", "--reconcile-interval", "1s",
		"--leader-lease", "2s", "--provider", "libvirt-ha")
	var targets []string
	for _, r := range s.reps {
		targets = append(targets, r.MetricsAddr())
	}
	p := startPrometheus(t, targets)
	old := s.waitLeader(t)
	oldInst, newInst := s.reps[old].MetricsAddr(), s.reps[1-old].MetricsAddr()
	one := func(r []sample) bool { return len(r) == 1 && r[0].Value == 1 }
	p.await(t, "one replica serves", `sum by (job, provider) (bigfleet_provider_serving)`, one)
	p.await(t, "the leader's zones are observed", fmt.Sprintf(`count(bigfleet_provider_zone_last_observed_timestamp_seconds{instance=%q})`, oldInst),
		func(r []sample) bool { return len(r) == 1 && r[0].Value == 2 })

	// Fail-over: the leader freezes past its lease and comes back.
	s.pause(t, old)
	if next := s.waitLeader(t); next == old {
		t.Fatalf("replica %d leads again while paused", old)
	}
	time.Sleep(3 * time.Second)
	s.reps[old].Cont()
	p.await(t, "the deposed leader is scraped again, standing by", fmt.Sprintf(`bigfleet_provider_serving{instance=%q}`, oldInst),
		func(r []sample) bool { return len(r) == 1 && r[0].Value == 0 })
	p.await(t, "the new leader serves", fmt.Sprintf(`bigfleet_provider_serving{instance=%q}`, newInst), one)
	p.await(t, "the new leader's zones are observed", fmt.Sprintf(`count(bigfleet_provider_zone_last_observed_timestamp_seconds{instance=%q})`, newInst),
		func(r []sample) bool { return len(r) == 1 && r[0].Value == 2 })
	// For ten seconds (ten scrapes and rule evaluations; the stale
	// threshold is 3 reconcile intervals, 3s): nothing of the deposed
	// leader's term, and no ObservationStale, pending or firing.
	for i := 0; i < 10; i++ {
		for _, q := range []string{
			fmt.Sprintf(`bigfleet_provider_zone_last_observed_timestamp_seconds{instance=%q}`, oldInst),
			fmt.Sprintf(`bigfleet_provider_zone_up{instance=%q}`, oldInst),
			fmt.Sprintf(`bigfleet_provider_drift{instance=%q}`, oldInst),
			fmt.Sprintf(`bigfleet_provider_machines{instance=%q}`, oldInst),
			`ALERTS{alertname="BigFleetProviderObservationStale"}`,
			`ALERTS{alertname="BigFleetProviderNotServing"}`,
		} {
			if r := p.query(t, q); len(r) != 0 {
				t.Errorf("after the fail-over: %s = %+v, want nothing", q, r)
			}
		}
		if r := p.query(t, `sum by (job, provider) (bigfleet_provider_serving)`); !one(r) {
			t.Errorf("after the fail-over, serving replicas: %+v", r)
		}
		time.Sleep(time.Second)
	}

	// etcd loses its quorum: both replicas stand by, neither can read the
	// state.
	first := c.WaitLeader(t)
	c.Kill(t, first)
	c.Kill(t, (first+1)%3)
	p.await(t, "nobody serves", `sum by (job, provider) (bigfleet_provider_serving)`, func(r []sample) bool { return len(r) == 1 && r[0].Value == 0 })
	p.await(t, "both replicas report the state unusable", `count(bigfleet_provider_state_healthy == 0)`,
		func(r []sample) bool { return len(r) == 1 && r[0].Value == 2 })
	p.await(t, "NotServing is pending", `ALERTS{alertname="BigFleetProviderNotServing",provider="libvirt-ha"}`,
		func(r []sample) bool { return len(r) == 1 })

	// Both processes die: their targets are down.
	for _, r := range s.reps {
		r.Kill()
	}
	p.await(t, "TargetDown is pending for both", `count(ALERTS{alertname="BigFleetProviderTargetDown"})`,
		func(r []sample) bool { return len(r) == 1 && r[0].Value == 2 })
	p.await(t, "NotServing stays", `ALERTS{alertname="BigFleetProviderNotServing",provider="libvirt-ha"}`,
		func(r []sample) bool { return len(r) == 1 })
}
