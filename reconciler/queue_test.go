package reconciler

import (
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/util/workqueue"

	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/libvirtsim"
	"github.com/bigfleet-vm/provider/hypervisors/simcore"
)

// queueProbe is a workqueue.MetricsProvider that records when the queue
// retried a machine (AddRateLimited) and how deep it got.
type queueProbe struct {
	mu       sync.Mutex
	retries  []time.Time
	maxDepth float64
	depth    float64
}

type probeCounter struct{ f func() }

func (c probeCounter) Inc() { c.f() }

type probeGauge struct{ p *queueProbe }

func (g probeGauge) Inc() { g.add(1) }
func (g probeGauge) Dec() { g.add(-1) }
func (g probeGauge) add(d float64) {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	g.p.depth += d
	g.p.maxDepth = max(g.p.maxDepth, g.p.depth)
}

type nopMetric struct{}

func (nopMetric) Inc()            {}
func (nopMetric) Observe(float64) {}
func (nopMetric) Set(float64)     {}

func (p *queueProbe) NewDepthMetric(string) workqueue.GaugeMetric  { return probeGauge{p} }
func (p *queueProbe) NewAddsMetric(string) workqueue.CounterMetric { return nopMetric{} }
func (p *queueProbe) NewLatencyMetric(string) workqueue.HistogramMetric {
	return nopMetric{}
}
func (p *queueProbe) NewWorkDurationMetric(string) workqueue.HistogramMetric { return nopMetric{} }
func (p *queueProbe) NewUnfinishedWorkSecondsMetric(string) workqueue.SettableGaugeMetric {
	return nopMetric{}
}
func (p *queueProbe) NewLongestRunningProcessorSecondsMetric(string) workqueue.SettableGaugeMetric {
	return nopMetric{}
}
func (p *queueProbe) NewRetriesMetric(string) workqueue.CounterMetric {
	return probeCounter{func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.retries = append(p.retries, time.Now())
	}}
}

func (p *queueProbe) snapshot() ([]time.Time, float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.retries...), p.maxDepth
}

// A machine that can make no progress (its zone is down) is retried by
// the rate-limited queue with a per-machine backoff that grows, and the
// queue reports its depth and retries through the metrics provider. The
// bounds are lower bounds on waits, which load can only lengthen.
func TestQueueBacksOffPerMachineAndReports(t *testing.T) {
	probe := &queueProbe{}
	const retryMin = 10 * time.Millisecond
	r := newRig(t, "libvirt", desired.NewMemoryStore(nil), simcore.Options{}, func(o *Options) {
		o.QueueMetrics, o.RetryMin, o.RetryMax, o.Interval = probe, retryMin, time.Minute, 0
	})
	r.hv.(*libvirtsim.Libvirt).SetUnreachable("z1", true)
	id := "z1/t/001"
	r.mutate(t, desired.Request{Kind: desired.KindCreate, MachineID: id})
	deadline := time.Now().Add(30 * time.Second)
	var retries []time.Time
	var depth float64
	for {
		if retries, depth = probe.snapshot(); len(retries) >= 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the queue retried the unreachable machine %d times in 30 s, want 5", len(retries))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if depth < 1 {
		t.Errorf("the queue never reported a depth of 1 or more (max %v)", depth)
	}
	// Retry k waits at least retryMin * 2^(k-1) after it was queued, so the
	// gaps between retries grow: the fourth one is at least 8 * retryMin.
	for k := 1; k < len(retries); k++ {
		if gap, least := retries[k].Sub(retries[k-1]), retryMin<<(k-1); gap < least {
			t.Errorf("retry %d came %v after the one before, want at least %v (per-machine backoff)", k+1, gap, least)
		}
	}
	if st := r.doc.Get(id).State; st != desired.Creating {
		t.Errorf("state %s while the zone is down, want CREATING", st)
	}
}
