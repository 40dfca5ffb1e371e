package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"
)

// QueueMetrics returns a workqueue.MetricsProvider registering the
// reconciler queue's metrics in m's registry, under the provider's prefix:
// bigfleet_provider_workqueue_{depth,adds_total,queue_duration_seconds,
// work_duration_seconds,unfinished_work_seconds,
// longest_running_processor_seconds,retries_total}, labelled by queue name.
// It returns nil on a nil *Metrics (the queue then keeps no metrics).
func (m *Metrics) QueueMetrics() workqueue.MetricsProvider {
	if m == nil {
		return nil
	}
	if m.queue == nil {
		m.queue = newQueueMetrics(m.Registry)
	}
	return m.queue
}

type queueMetrics struct {
	depth, unfinished, longest *prometheus.GaugeVec
	adds, retries              *prometheus.CounterVec
	latency, work              *prometheus.HistogramVec
}

func newQueueMetrics(r *prometheus.Registry) *queueMetrics {
	lat := prometheus.ExponentialBuckets(0.0005, 4, 10)
	q := &queueMetrics{
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: "workqueue", Name: "depth",
			Help: "Machines waiting in the work queue."}, []string{"name"}),
		adds: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: "workqueue", Name: "adds_total",
			Help: "Machines added to the work queue."}, []string{"name"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: "workqueue", Name: "queue_duration_seconds",
			Help: "How long a machine waited in the work queue.", Buckets: lat}, []string{"name"}),
		work: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: "workqueue", Name: "work_duration_seconds",
			Help: "How long reconciling one machine took.", Buckets: lat}, []string{"name"}),
		unfinished: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: "workqueue", Name: "unfinished_work_seconds",
			Help: "Seconds of work in progress not yet observed by work_duration_seconds."}, []string{"name"}),
		longest: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: "workqueue", Name: "longest_running_processor_seconds",
			Help: "How long the longest running reconcile has been running."}, []string{"name"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: "workqueue", Name: "retries_total",
			Help: "Machines requeued with backoff (waiting for a zone, or a failed repair)."}, []string{"name"}),
	}
	r.MustRegister(q.depth, q.adds, q.latency, q.work, q.unfinished, q.longest, q.retries)
	return q
}

func (q *queueMetrics) NewDepthMetric(name string) workqueue.GaugeMetric {
	return q.depth.WithLabelValues(name)
}

func (q *queueMetrics) NewAddsMetric(name string) workqueue.CounterMetric {
	return q.adds.WithLabelValues(name)
}

func (q *queueMetrics) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return q.latency.WithLabelValues(name)
}

func (q *queueMetrics) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return q.work.WithLabelValues(name)
}

func (q *queueMetrics) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return q.unfinished.WithLabelValues(name)
}

func (q *queueMetrics) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return q.longest.WithLabelValues(name)
}

func (q *queueMetrics) NewRetriesMetric(name string) workqueue.CounterMetric {
	return q.retries.WithLabelValues(name)
}
