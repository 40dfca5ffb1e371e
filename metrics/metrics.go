package metrics

import (
	"sync"
	"sync/atomic"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/bigfleet-vm/provider/version"
)

const ns = "bigfleet_provider"

// Metrics holds every collector.
type Metrics struct {
	Registry *prometheus.Registry

	reconciles     *prometheus.CounterVec
	reconcileDur   *prometheus.HistogramVec
	repairFailures *prometheus.CounterVec
	steps          *prometheus.CounterVec
	stepDur        *prometheus.HistogramVec
	hvCalls        *prometheus.CounterVec
	hvDur          *prometheus.HistogramVec
	grpc           *grpcprom.ServerMetrics
	commits        prometheus.Counter
	commitRecords  prometheus.Counter
	fsyncDur       prometheus.Histogram
	stateSize      prometheus.GaugeFunc
	queue          *queueMetrics
	interval       prometheus.Gauge
	// health reports the state store's health for the state_healthy
	// gauge; nil until StateHealth is called (reported healthy).
	health atomic.Pointer[func() error]
	// rejected counts unary RPCs answered with a code other than OK.
	rejected *prometheus.CounterVec
	// certs is registered by the first CertificateExpiry call.
	certsOnce sync.Once
	certs     *certExpiry
	// term is the term whose series are exported (Serve); nil on a
	// replica that serves no desired state.
	term     atomic.Pointer[Term]
	provider atomic.Pointer[string]
	// zoneHealth, when set, makes zone_up live (SetZoneHealth).
	zoneHealth atomic.Pointer[func() map[string]error]
	// followLag reports how far behind the committed state this replica
	// is (FollowLag); nil without a replicated store.
	followLag atomic.Pointer[func() (float64, bool)]
}

// Counts reports machines by (state, zone, instance type).
type Counts func() map[[3]string]int

// New registers every collector. counts feeds the machines gauge;
// stateSize reports the state store's size in bytes.
func New(counts Counts, stateSize func() float64) *Metrics {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := &Metrics{Registry: r}
	f := func(c prometheus.Collector) { r.MustRegister(c) }
	lat := prometheus.ExponentialBuckets(0.0005, 4, 10) // 0.5ms .. ~131s

	f(&termCollector{m: m, counts: counts})
	f(&replicaCollector{m: m})
	m.reconciles = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "reconciles_total",
		Help: "Reconciles (per machine, and full passes) by outcome."}, []string{"outcome"})
	m.reconcileDur = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "reconcile_duration_seconds",
		Help: "Duration of reconciles by outcome.", Buckets: lat}, []string{"outcome"})
	m.repairFailures = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "repair_failures_total",
		Help: "Drift repairs that ran out of attempts (--repair-attempts) or time (--repair-timeout), or failed terminally, by zone; the machine went back to the work queue with backoff (/debug/repairs lists them)."}, []string{"zone"})
	m.steps = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "executor_steps_total",
		Help: "Executed plan steps by action and outcome."}, []string{"action", "outcome"})
	m.stepDur = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "executor_step_duration_seconds",
		Help: "Duration of executed steps by zone and action (where a Create spends its time, per zone).", Buckets: stepBuckets}, []string{"zone", "action"})
	m.hvCalls = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "hypervisor_calls_total",
		Help: "Hypervisor calls by operation and outcome."}, []string{"op", "outcome"})
	// One family, three kinds of series (labels documented in
	// docs/operations.md): adapter operations {op, zone, procedure=""};
	// the libvirt RPCs they are made of {op="rpc", zone="", procedure};
	// the per-connection liveness probe {op="probe", zone, procedure=""}.
	// Buckets from 0.5ms to 2m, finer than lat where RPC deadlines lie.
	m.hvDur = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "hypervisor_call_duration_seconds",
		Help:    "Hypervisor call latency: adapter operations by op and zone; libvirt RPCs as op=rpc by procedure; the liveness probe as op=probe by zone.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 15, 30, 60, 120}}, []string{"op", "zone", "procedure"})
	// The standard gRPC server metrics, unprefixed so that stock gRPC
	// dashboards and alerts work: grpc_server_started_total,
	// grpc_server_handled_total{grpc_type,grpc_service,grpc_method,grpc_code},
	// grpc_server_msg_{received,sent}_total and grpc_server_handling_seconds.
	m.grpc = grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
		grpcprom.WithHistogramBuckets([]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10})))
	m.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "rpc_rejected_total",
		Help: "Unary RPCs answered with a code other than OK, by full method and code (every one, also those whose log line was sampled away)."},
		[]string{"method", "code"})
	m.interval = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "reconcile_interval_seconds",
		Help: "The configured background reconcile interval (--reconcile-interval); 0 when background reconcile is off."})
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "build_info",
		Help:        "Always 1; the labels say which build is running.",
		ConstLabels: prometheus.Labels{"version": version.String(), "goversion": version.Go()}})
	buildInfo.Set(1)
	stateHealthy := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "state_healthy",
		Help: "1 while the state store is usable: on the serving replica it can commit (what /readyz checks), on a standby of a replicated store it can be read; else 0 (a failed write or fsync, a lost etcd quorum)."}, func() float64 {
		if f := m.health.Load(); f != nil && (*f)() != nil {
			return 0
		}
		return 1
	})
	m.commits = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "state_commits_total",
		Help: "Group commits (fsyncs) of the state store."})
	m.commitRecords = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "state_records_total",
		Help: "Records made durable by the state store."})
	m.fsyncDur = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "state_fsync_duration_seconds",
		Help: "fsync latency of state commits.", Buckets: lat})
	if stateSize == nil {
		stateSize = func() float64 { return 0 }
	}
	m.stateSize = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "state_size_bytes",
		Help: "Bytes the state store occupies on disk."}, stateSize)
	for _, c := range []prometheus.Collector{m.reconciles, m.reconcileDur, m.repairFailures,
		m.steps, m.stepDur, m.hvCalls, m.hvDur, m.grpc, m.commits, m.commitRecords, m.fsyncDur,
		m.stateSize, m.interval, buildInfo, stateHealthy, m.rejected} {
		f(c)
	}
	return m
}

// Reconciled counts one reconcile.
func (m *Metrics) Reconciled(outcome string, d time.Duration) {
	if m == nil {
		return
	}
	m.reconciles.WithLabelValues(outcome).Inc()
	m.reconcileDur.WithLabelValues(outcome).Observe(d.Seconds())
}

// SetZoneHealth makes zone_up live: at every scrape it reports the zones
// health returns (nil error: up) instead of the last observation, so it
// always agrees with /readyz, which reads the same function.
func (m *Metrics) SetZoneHealth(health func() map[string]error) {
	if m == nil {
		return
	}
	m.zoneHealth.Store(&health)
}

// SetProvider names the provider (--provider) on the serving gauge, so
// the replicas of one provider are told from other providers scraped
// under the same job.
func (m *Metrics) SetProvider(name string) {
	if m == nil {
		return
	}
	m.provider.Store(&name)
}

// FollowLag makes state_follow_lag_seconds report lag at every scrape:
// how many seconds this replica is behind the committed state of a
// replicated store (ok false: not exported, e.g. a single replica).
func (m *Metrics) FollowLag(lag func() (float64, bool)) {
	if m == nil || lag == nil {
		return
	}
	m.followLag.Store(&lag)
}

// stepBuckets cover a step from a local call (milliseconds) to a clone of
// a large disk or a slow agent (minutes).
var stepBuckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120, 300, 600}

// StepDone counts an executed step.
func (m *Metrics) StepDone(zone, action, outcome string, d time.Duration) {
	if m == nil {
		return
	}
	m.steps.WithLabelValues(action, outcome).Inc()
	m.stepDur.WithLabelValues(zone, action).Observe(d.Seconds())
}

// HypervisorCall counts a hypervisor call (an adapter operation) in zone.
func (m *Metrics) HypervisorCall(op, zone string, err error, d time.Duration) {
	if m == nil {
		return
	}
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	m.hvCalls.WithLabelValues(op, outcome).Inc()
	m.hvDur.WithLabelValues(op, zone, "").Observe(d.Seconds())
}

// HypervisorRPC times one RPC an adapter operation made (libvirt:
// procedure is go-libvirt's name for it), or, with procedure "", one
// liveness probe of zone's connection. RPCs carry no zone, so the series
// stay one per procedure whatever the number of hosts.
func (m *Metrics) HypervisorRPC(zone, procedure string, d time.Duration, _ error) {
	if m == nil {
		return
	}
	if procedure == "" {
		m.hvDur.WithLabelValues("probe", zone, "").Observe(d.Seconds())
		return
	}
	m.hvDur.WithLabelValues("rpc", "", procedure).Observe(d.Seconds())
}

// StateHealth makes the state_healthy gauge report health (nil error:
// healthy), evaluated at scrape time.
func (m *Metrics) StateHealth(health func() error) {
	if m == nil || health == nil {
		return
	}
	m.health.Store(&health)
}

// ReconcileInterval publishes the configured background reconcile
// interval, so alerts can say "no observation for 3 intervals" without
// knowing the flag.
func (m *Metrics) ReconcileInterval(d time.Duration) {
	if m == nil {
		return
	}
	m.interval.Set(d.Seconds())
}

// Commit records one group commit of the state store.
func (m *Metrics) Commit(records, bytes int, fsync time.Duration) {
	if m == nil {
		return
	}
	m.commits.Inc()
	m.commitRecords.Add(float64(records))
	m.fsyncDur.Observe(fsync.Seconds())
}
