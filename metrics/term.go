package metrics

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/bigfleet-vm/provider/capacity"
	"github.com/bigfleet-vm/provider/planner"
)

// Term is the part of the metrics one term of the desired state feeds
// (it is the reconciler's Metrics): its zone observations and the plan
// totals its reconciler publishes, plus the reconcile and repair counts
// it passes on. Only the term named by Serve is exported, and only while
// its guard holds: a standby, or a leader whose lease ran out before its
// timers noticed, exports no zone, drift, pending-step, observation or
// machine series, so nothing frozen is left behind after a fail-over.
// Every method is safe on a nil *Term.
type Term struct {
	m     *Metrics
	guard func() error

	mu       sync.Mutex
	observed map[string]zoneObservation

	totals atomic.Pointer[planner.Totals]
	hosts  atomic.Pointer[[]capacity.Zone]
}

type zoneObservation struct {
	up bool
	at float64 // unix seconds of the last successful observation; 0: none
}

// NewTerm returns the metrics of a new term. guard, when set, says whether
// the term still holds (an etcd leadership term's Err); a term whose guard
// fails exports nothing even while Serve still names it.
func (m *Metrics) NewTerm(guard func() error) *Term {
	if m == nil {
		return nil
	}
	return &Term{m: m, guard: guard, observed: map[string]zoneObservation{}}
}

// Serve makes t the term whose series are exported; nil exports none (a
// standby). The serving gauge follows it.
func (m *Metrics) Serve(t *Term) {
	if m == nil {
		return
	}
	m.term.Store(t)
}

// serving returns the exported term, or nil when this replica serves no
// desired state (none named, or its guard fails).
func (m *Metrics) serving() *Term {
	t := m.term.Load()
	if t == nil || (t.guard != nil && t.guard() != nil) {
		return nil
	}
	return t
}

// Reconciled counts one reconcile.
func (t *Term) Reconciled(outcome string, d time.Duration) {
	if t == nil {
		return
	}
	t.m.Reconciled(outcome, d)
}

// RepairFailed counts a drift repair that failed.
func (t *Term) RepairFailed(zone string) {
	if t == nil {
		return
	}
	t.m.repairFailures.WithLabelValues(zone).Inc()
}

// ZoneObserved records one observation of a zone by a full pass.
func (t *Term) ZoneObserved(zone string, ok bool, at time.Time) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	o := t.observed[zone]
	o.up = ok
	if ok {
		o.at = float64(at.UnixNano()) / 1e9
	}
	t.observed[zone] = o
}

// PlanTotals publishes the drift and pending steps the newest plans
// found. p must not be changed afterwards: a scrape reads it whole.
func (t *Term) PlanTotals(p *planner.Totals) {
	if t == nil {
		return
	}
	t.totals.Store(p)
}

// ZoneCapacity publishes the newest comparison of the zones' offerings
// with their hosts (the zones read). zones must not be changed
// afterwards: a scrape reads it whole.
func (t *Term) ZoneCapacity(zones []capacity.Zone) {
	if t == nil {
		return
	}
	t.hosts.Store(&zones)
}

var (
	capacityDesc = prometheus.NewDesc(ns+"_zone_capacity",
		"A zone's host as its hypervisor reports it, read at start and on every full pass: resource cpu (CPUs), memory (bytes), disk (bytes of the zone's pool or target storage). Exported by the serving replica only, for the zones read.",
		[]string{"zone", "resource"}, nil)
	offeredDesc = prometheus.NewDesc(ns+"_zone_offered",
		"What a zone's offerings can place: every slot (SPECULATIVE or not) times its instance type, by resource cpu (vCPUs) and memory (bytes). Exported by the serving replica only, for the zones whose capacity was read.",
		[]string{"zone", "resource"}, nil)
	runningDesc = prometheus.NewDesc(ns+"_zone_running",
		"What already runs in a zone: the slots not SPECULATIVE times their instance type, by resource cpu (vCPUs) and memory (bytes). Exported by the serving replica only, for the zones whose capacity was read.",
		[]string{"zone", "resource"}, nil)
	overcommitDesc = prometheus.NewDesc(ns+"_zone_overcommit_ratio",
		"zone_offered over zone_capacity by resource (cpu, memory): above 1, the offerings promise more than the host has. Exported by the serving replica only, for the zones whose capacity was read.",
		[]string{"zone", "resource"}, nil)
	driftDesc = prometheus.NewDesc(ns+"_drift",
		"Drift findings by zone and kind, as the newest plan of each machine found them (a full pass, or the machine's own reconcile since); every kind is reported for every zone the last full pass saw. Exported by the serving replica only.",
		[]string{"zone", "kind"}, nil)
	pendingDesc = prometheus.NewDesc(ns+"_plan_pending_steps",
		"Steps pending by action, as the newest plan of each machine found them. Exported by the serving replica only.",
		[]string{"action"}, nil)
	planStepsDesc = prometheus.NewDesc(ns+"_plan_steps",
		"Steps pending in all (the sum of plan_pending_steps). Exported by the serving replica only.", nil, nil)
	planAtDesc = prometheus.NewDesc(ns+"_plan_last_timestamp_seconds",
		"Unix time of the last full plan. Exported by the serving replica only.", nil, nil)
	lastObservedDesc = prometheus.NewDesc(ns+"_zone_last_observed_timestamp_seconds",
		"Unix time of the last successful observation of a zone by a full pass. Exported by the serving replica only.",
		[]string{"zone"}, nil)
	zoneUpDesc = prometheus.NewDesc(ns+"_zone_up",
		"1 while a zone is up (adapters that track connection health: computed at scrape time from the same status /readyz shows; others: the last observation succeeded), else 0. Exported by the serving replica only.",
		[]string{"zone"}, nil)
	machinesDesc = prometheus.NewDesc(ns+"_machines",
		"Machines by lifecycle state, zone and instance type. Exported by the serving replica only.",
		[]string{"state", "zone", "instance_type"}, nil)
	servingDesc = prometheus.NewDesc(ns+"_serving",
		"1 while this replica serves the desired state (a single provider once started; of replicas sharing an etcd state, the leader while its lease holds), else 0 (a standby). Only the serving replica exports zone, drift, plan, observation and machine series.",
		[]string{"provider"}, nil)
	followLagDesc = prometheus.NewDesc(ns+"_state_follow_lag_seconds",
		"Replicas of a replicated (etcd) state: on a standby, the age of the newest committed state its warm copy of the document has caught up with (the state is read every 2 s; the copy must reach that read's revision); 0 on the leader, which writes it. A standby that cannot follow or keep up grows it.",
		nil, nil)
)

// termCollector exports the serving term's series, each family read from
// one snapshot: the plan families from one published Totals.
type termCollector struct {
	m      *Metrics
	counts Counts
}

func (c *termCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{driftDesc, pendingDesc, planStepsDesc, planAtDesc, lastObservedDesc, zoneUpDesc, machinesDesc,
		capacityDesc, offeredDesc, runningDesc, overcommitDesc} {
		ch <- d
	}
}

func (c *termCollector) Collect(ch chan<- prometheus.Metric) {
	t := c.m.serving()
	if t == nil {
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	if p := t.totals.Load(); p != nil {
		// Every zone reports every kind the plans may use (zeros
		// included), and any other finding as it is.
		reported := make(map[planner.DriftKey]bool, len(p.Zones)*len(p.DriftKinds))
		for _, z := range p.Zones {
			for _, k := range p.DriftKinds {
				key := planner.DriftKey{Zone: z, Kind: k}
				reported[key] = true
				gauge(driftDesc, float64(p.Drift[key]), z, string(k))
			}
		}
		for k, n := range p.Drift {
			if !reported[k] {
				gauge(driftDesc, float64(n), k.Zone, string(k.Kind))
			}
		}
		listed := make(map[planner.Action]bool, len(p.Actions))
		for _, a := range p.Actions {
			listed[a] = true
			gauge(pendingDesc, float64(p.Pending[a]), string(a))
		}
		for a, n := range p.Pending {
			if !listed[a] {
				gauge(pendingDesc, float64(n), string(a))
			}
		}
		gauge(planStepsDesc, float64(p.Steps))
		if !p.PlannedAt.IsZero() {
			gauge(planAtDesc, float64(p.PlannedAt.UnixNano())/1e9)
		}
	}
	t.mu.Lock()
	observed := make(map[string]zoneObservation, len(t.observed))
	for z, o := range t.observed {
		observed[z] = o
	}
	t.mu.Unlock()
	up := make(map[string]bool, len(observed))
	for z, o := range observed {
		up[z] = o.up
		if o.at > 0 {
			gauge(lastObservedDesc, o.at, z)
		}
	}
	if h := c.m.zoneHealth.Load(); h != nil {
		if live := (*h)(); live != nil {
			up = make(map[string]bool, len(live))
			for z, err := range live {
				up[z] = err == nil
			}
		}
	}
	for z, ok := range up {
		v := 0.0
		if ok {
			v = 1
		}
		gauge(zoneUpDesc, v, z)
	}
	if hosts := t.hosts.Load(); hosts != nil {
		for _, z := range *hosts {
			if z.Host.CPUs > 0 {
				gauge(capacityDesc, float64(z.Host.CPUs), z.Zone, capacity.CPU)
			}
			if z.Host.MemoryBytes > 0 {
				gauge(capacityDesc, float64(z.Host.MemoryBytes), z.Zone, capacity.Memory)
			}
			if z.Host.DiskBytes > 0 {
				gauge(capacityDesc, float64(z.Host.DiskBytes), z.Zone, capacity.Disk)
			}
			gauge(offeredDesc, float64(z.Offered.VCPU), z.Zone, capacity.CPU)
			gauge(offeredDesc, float64(z.Offered.MemoryBytes), z.Zone, capacity.Memory)
			gauge(runningDesc, float64(z.Running.VCPU), z.Zone, capacity.CPU)
			gauge(runningDesc, float64(z.Running.MemoryBytes), z.Zone, capacity.Memory)
			for _, r := range capacity.Resources {
				if v := z.Ratio(r); v > 0 {
					gauge(overcommitDesc, v, z.Zone, r)
				}
			}
		}
	}
	if c.counts != nil {
		for k, n := range c.counts() {
			gauge(machinesDesc, float64(n), k[0], k[1], k[2])
		}
	}
}

// replicaCollector exports what every replica reports about itself: the
// serving gauge and, with a replicated store, the follow lag.
type replicaCollector struct{ m *Metrics }

func (c *replicaCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- servingDesc
	ch <- followLagDesc
}

func (c *replicaCollector) Collect(ch chan<- prometheus.Metric) {
	provider := ""
	if p := c.m.provider.Load(); p != nil {
		provider = *p
	}
	v := 0.0
	if c.m.serving() != nil {
		v = 1
	}
	ch <- prometheus.MustNewConstMetric(servingDesc, prometheus.GaugeValue, v, provider)
	if f := c.m.followLag.Load(); f != nil {
		if lag, ok := (*f)(); ok {
			ch <- prometheus.MustNewConstMetric(followLagDesc, prometheus.GaugeValue, lag)
		}
	}
}
