package metrics

import (
	"sync"
	"sync/atomic"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/bigfleet-vm/provider/planner"
	"github.com/bigfleet-vm/provider/version"
)

const ns = "bigfleet_provider"

// Metrics holds every collector.
type Metrics struct {
	Registry *prometheus.Registry

	drift         *prometheus.GaugeVec
	pending       *prometheus.GaugeVec
	reconciles    *prometheus.CounterVec
	reconcileDur  *prometheus.HistogramVec
	lastObserved  *prometheus.GaugeVec
	zoneUp        *zoneUpCollector
	steps         *prometheus.CounterVec
	stepDur       *prometheus.HistogramVec
	hvCalls       *prometheus.CounterVec
	hvDur         *prometheus.HistogramVec
	grpc          *grpcprom.ServerMetrics
	commits       prometheus.Counter
	commitRecords prometheus.Counter
	fsyncDur      prometheus.Histogram
	stateSize     prometheus.GaugeFunc
	planSteps     prometheus.Gauge
	lastPlanUnix  prometheus.Gauge
	queue         *queueMetrics
	interval      prometheus.Gauge
	// health reports the state store's health for the state_healthy
	// gauge; nil until StateHealth is called (reported healthy).
	health atomic.Pointer[func() error]
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

	f(&machineCollector{desc: prometheus.NewDesc(ns+"_machines", "Machines by lifecycle state, zone and instance type.",
		[]string{"state", "zone", "instance_type"}, nil), counts: counts})
	m.drift = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "drift",
		Help: "Drift findings in the last full plan by zone and kind."}, []string{"zone", "kind"})
	m.pending = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "plan_pending_steps",
		Help: "Steps pending in the last full plan by action."}, []string{"action"})
	m.reconciles = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "reconciles_total",
		Help: "Reconciles (per machine, and full passes) by outcome."}, []string{"outcome"})
	m.reconcileDur = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "reconcile_duration_seconds",
		Help: "Duration of reconciles by outcome.", Buckets: lat}, []string{"outcome"})
	m.lastObserved = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "zone_last_observed_timestamp_seconds",
		Help: "Unix time of the last successful observation of a zone."}, []string{"zone"})
	m.zoneUp = &zoneUpCollector{desc: prometheus.NewDesc(ns+"_zone_up",
		"1 while a zone is up (adapters that track connection health: computed at scrape time from the same status /readyz shows; others: the last observation succeeded), else 0.",
		[]string{"zone"}, nil), observed: map[string]float64{}}
	m.steps = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "executor_steps_total",
		Help: "Executed plan steps by action and outcome."}, []string{"action", "outcome"})
	m.stepDur = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "executor_step_duration_seconds",
		Help: "Duration of executed steps by action.", Buckets: lat}, []string{"action"})
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
	m.interval = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "reconcile_interval_seconds",
		Help: "The configured background reconcile interval (--reconcile-interval); 0 when background reconcile is off."})
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "build_info",
		Help:        "Always 1; the labels say which build is running.",
		ConstLabels: prometheus.Labels{"version": version.String(), "goversion": version.Go()}})
	buildInfo.Set(1)
	stateHealthy := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "state_healthy",
		Help: "1 while the state store can commit (what /readyz checks), else 0."}, func() float64 {
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
	m.planSteps = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "plan_steps",
		Help: "Steps in the last full plan."})
	m.lastPlanUnix = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "plan_last_timestamp_seconds",
		Help: "Unix time of the last full plan."})
	if stateSize == nil {
		stateSize = func() float64 { return 0 }
	}
	m.stateSize = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "state_size_bytes",
		Help: "Bytes the state store occupies on disk."}, stateSize)
	for _, c := range []prometheus.Collector{m.drift, m.pending, m.reconciles, m.reconcileDur, m.lastObserved, m.zoneUp,
		m.steps, m.stepDur, m.hvCalls, m.hvDur, m.grpc, m.commits, m.commitRecords, m.fsyncDur,
		m.stateSize, m.planSteps, m.lastPlanUnix, m.interval, buildInfo, stateHealthy} {
		f(c)
	}
	return m
}

type machineCollector struct {
	desc   *prometheus.Desc
	counts Counts
}

func (c *machineCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *machineCollector) Collect(ch chan<- prometheus.Metric) {
	if c.counts == nil {
		return
	}
	for k, n := range c.counts() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), k[0], k[1], k[2])
	}
}

// Reconciled counts one reconcile.
func (m *Metrics) Reconciled(outcome string, d time.Duration) {
	if m == nil {
		return
	}
	m.reconciles.WithLabelValues(outcome).Inc()
	m.reconcileDur.WithLabelValues(outcome).Observe(d.Seconds())
}

// ZoneObserved records a zone observation.
func (m *Metrics) ZoneObserved(zone string, ok bool, at time.Time) {
	if m == nil {
		return
	}
	if ok {
		m.lastObserved.WithLabelValues(zone).Set(float64(at.UnixNano()) / 1e9)
	}
	m.zoneUp.observe(zone, ok)
}

// SetZoneHealth makes zone_up live: at every scrape it reports the zones
// health returns (nil error: up) instead of the last observation, so it
// always agrees with /readyz, which reads the same function.
func (m *Metrics) SetZoneHealth(health func() map[string]error) {
	if m == nil {
		return
	}
	m.zoneUp.mu.Lock()
	m.zoneUp.health = health
	m.zoneUp.mu.Unlock()
}

// zoneUpCollector reports zone_up from live health when it has a source,
// else from the last observation of each zone.
type zoneUpCollector struct {
	desc     *prometheus.Desc
	mu       sync.Mutex
	health   func() map[string]error
	observed map[string]float64
}

func (c *zoneUpCollector) observe(zone string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.observed[zone] = 0
	if ok {
		c.observed[zone] = 1
	}
}

func (c *zoneUpCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *zoneUpCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	health := c.health
	vals := make(map[string]float64, len(c.observed))
	for z, v := range c.observed {
		vals[z] = v
	}
	c.mu.Unlock()
	if health != nil {
		if h := health(); h != nil {
			vals = make(map[string]float64, len(h))
			for z, err := range h {
				vals[z] = 0
				if err == nil {
					vals[z] = 1
				}
			}
		}
	}
	for z, v := range vals {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, z)
	}
}

// Planned publishes a full plan's drift and pending steps.
func (m *Metrics) Planned(p *planner.Plan) {
	if m == nil {
		return
	}
	m.drift.Reset()
	for _, z := range p.Zones {
		for _, k := range planner.DriftKinds {
			m.drift.WithLabelValues(z.Name, string(k)).Set(0)
		}
	}
	for _, d := range p.Drift {
		m.drift.WithLabelValues(d.Zone, string(d.Kind)).Inc()
	}
	m.pending.Reset()
	for _, c := range p.Changes {
		for _, s := range c.Steps {
			m.pending.WithLabelValues(string(s.Action)).Inc()
		}
	}
	m.planSteps.Set(float64(p.Summary.Steps))
	m.lastPlanUnix.Set(float64(p.PlannedAt.UnixNano()) / 1e9)
}

// StepDone counts an executed step.
func (m *Metrics) StepDone(action, outcome string, d time.Duration) {
	if m == nil {
		return
	}
	m.steps.WithLabelValues(action, outcome).Inc()
	m.stepDur.WithLabelValues(action).Observe(d.Seconds())
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
