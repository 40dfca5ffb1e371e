package proxmox

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	pxapi "github.com/luthermonson/go-proxmox"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvesim"
	"github.com/bigfleet-vm/provider/naming"
)

// rawGet returns the body pvesim answers to one GET, as sent on the wire.
func rawGet(t testing.TB, e *env, path string) []byte {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, e.srv.URL+"/api2/json"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "PVEAPIToken="+testToken+"="+testSecret)
	res, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", path, res.StatusCode, err)
	}
	return b
}

// pollOnce makes one poll of the adapter's poller (the listing, node
// health, the diff against the previous poll) and checks it saw every VM
// and pushed no event (the fleet does not change).
func pollOnce(ctx context.Context, b *testing.B, a *Adapter, want int) {
	a.pollOnce(ctx)
	a.cacheMu.Lock()
	l := a.listing
	a.cacheMu.Unlock()
	if l == nil || len(l.vms) != want {
		b.Fatalf("poll did not list %d VMs (health %v)", want, a.ZoneHealth())
	}
	select {
	case ev := <-a.Events():
		if ev.Kind == hypervisors.EventVM {
			b.Fatalf("an unchanged fleet pushed %+v", ev)
		}
	default:
	}
}

// cpuTime is the CPU time (user + system) this process used so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process CPU time per op since start, and the share
// of one core the poller takes at the default PollInterval.
func reportCPU(b *testing.B, start time.Duration) {
	per := (cpuTime(b) - start) / time.Duration(b.N)
	b.ReportMetric(float64(per.Nanoseconds()), "cpu-ns/poll")
	b.ReportMetric(100*per.Seconds()/time.Second.Seconds(), "core-%-at-1s")
}

// BenchmarkClusterVMPoll1000 measures one poll of the poller (GET
// /cluster/resources, node health, the diff) over an unchanged fleet of
// 1,000 VMs (plus the template) on pvesim. ns/op, B/op and cpu-ns/poll
// include pvesim building and encoding the answer in this process.
// resp-B/poll is the answer's size as pvesim sends it (uncompressed);
// resp-gzip-B/poll is its gzipped size, for a server that compresses for
// clients accepting gzip, as Go's transport asks by default.
func BenchmarkClusterVMPoll1000(b *testing.B) {
	e := newEnv(b, nil, nil)
	fleet(b, e, 1000)
	body := rawGet(b, e, "/cluster/resources")
	ctx := ctxT(b, 10*time.Minute)
	pollOnce(ctx, b, e.a, 1001) // the baseline; opens the connection
	b.ReportAllocs()
	start := cpuTime(b)
	for b.Loop() {
		pollOnce(ctx, b, e.a, 1001)
	}
	reportCPU(b, start)
	b.ReportMetric(float64(len(body)), "resp-B/poll")
	b.ReportMetric(float64(gzipSize(b, body)), "resp-gzip-B/poll")
}

func gzipSize(t testing.TB, body []byte) int {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(body); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Len()
}

// staticAdapter serves body (pvesim's answer to GET path, recorded once)
// from a static TLS handler and returns an adapter (poller off) talking to
// it: what it costs per request is the client side alone, what the
// provider pays on a real cluster, network and PVE's own work aside (the
// handler's TLS writes run in this process too).
func staticAdapter(b *testing.B, path string) (*Adapter, []byte) {
	e := newEnv(b, nil, nil)
	fleet(b, e, 1000)
	body := rawGet(b, e, path)
	static := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.RequestURI() != "/api2/json"+path {
			http.Error(w, "unexpected request", http.StatusNotImplemented)
			return
		}
		w.Header().Set("Content-Type", "application/json;charset=UTF-8")
		_, _ = w.Write(body)
	}))
	static.EnableHTTP2 = false
	static.StartTLS()
	b.Cleanup(static.Close)
	cfg := e.cfg
	sum := sha256.Sum256(static.Certificate().Raw)
	cfg.APIURL, cfg.Fingerprint = static.URL+"/api2/json", hex.EncodeToString(sum[:])
	a, err := New(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { a.Close() })
	return a, body
}

// BenchmarkClusterVMPollClient1000 is BenchmarkClusterVMPoll1000 with
// pvesim's answer replayed by a static handler (see staticAdapter).
func BenchmarkClusterVMPollClient1000(b *testing.B) {
	a, body := staticAdapter(b, "/cluster/resources")
	ctx := ctxT(b, 10*time.Minute)
	pollOnce(ctx, b, a, 1001)
	b.ReportAllocs()
	start := cpuTime(b)
	for b.Loop() {
		pollOnce(ctx, b, a, 1001)
	}
	reportCPU(b, start)
	b.ReportMetric(float64(len(body)), "resp-B/poll")
}

// BenchmarkClusterVMListGoProxmoxClient1000 is the same listing made the
// way the adapter listed before the poller (go-proxmox's Cluster.Resources
// with type=vm, against the same kind of static handler): the baseline
// that justifies fetch bypassing go-proxmox's decoding.
func BenchmarkClusterVMListGoProxmoxClient1000(b *testing.B) {
	a, _ := staticAdapter(b, "/cluster/resources?type=vm")
	ctx := ctxT(b, 10*time.Minute)
	list := func() {
		rs, err := (&pxapi.Cluster{}).New(a.client).Resources(ctx, "vm")
		if err != nil || len(rs) != 1001 {
			b.Fatalf("listing: %d VMs, %v", len(rs), err)
		}
	}
	list()
	b.ReportAllocs()
	start := cpuTime(b)
	for b.Loop() {
		list()
	}
	reportCPU(b, start)
}

// phase waits i tenths (mod 10) of the default PollInterval, so that the
// changes of successive ops fall evenly over the poll cycle (each op
// starts right after the poll that ended the previous one).
func phase(i int) { time.Sleep(time.Duration(i*3%10) * time.Second / 10) }

// latencies accumulates per-op durations: mean and worst.
type latencies struct {
	total, worst time.Duration
	n            int
}

func (l *latencies) add(d time.Duration) { l.total += d; l.worst = max(l.worst, d); l.n++ }

func (l *latencies) report(b *testing.B, unit string) {
	b.ReportMetric(l.total.Seconds()/float64(l.n), unit)
	b.ReportMetric(l.worst.Seconds(), "max-"+unit)
}

// BenchmarkOutOfBandStopToEvent measures, at the default PollInterval
// (1 s) over 1,000 VMs, the time from a VM stopped behind the adapter's
// back to its EventVM, changes spread over the poll cycle (run with
// -benchtime=20x: about 2 s per op).
func BenchmarkOutOfBandStopToEvent(b *testing.B) {
	e := newEnv(b, nil, polling(0))
	fleet(b, e, 1000)
	waitZones(b, e.a, hypervisors.EventZoneUp, nodes3...)
	var lat latencies
	for i := 0; b.Loop(); i++ {
		vmid := 1000 + 2*(i%500) // running VMs
		name := naming.VMName(testInst, fmt.Sprintf("m-%04d", vmid-1000), 1)
		phase(i)
		e.sim.SetPower(vmid, false)
		start := time.Now()
		nextEvent(b, e.a, "stop event", isVM(name))
		lat.add(time.Since(start))
		e.sim.SetPower(vmid, true)
		nextEvent(b, e.a, "start event", isVM(name))
	}
	lat.report(b, "s-to-event")
}

// BenchmarkAPIOutageToZoneDown measures, at the default PollInterval,
// PollTimeout and StallAfter, how long after the API fails every zone
// reports down, and how long after it answers again every zone is back up
// (EventZoneUp), for an API that refuses with 503 and one that hangs,
// outages spread over the poll cycle (run with -benchtime=10x).
func BenchmarkAPIOutageToZoneDown(b *testing.B) {
	for _, tc := range []struct {
		name string
		hook pvesim.RequestHook
	}{
		{"503", func(w http.ResponseWriter, _ *http.Request, _ func(http.ResponseWriter)) {
			http.Error(w, `{"data":null}`, http.StatusServiceUnavailable)
		}},
		{"hang", func(_ http.ResponseWriter, r *http.Request, _ func(http.ResponseWriter)) { <-r.Context().Done() }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			e := newEnv(b, nil, polling(0))
			waitZones(b, e.a, hypervisors.EventZoneUp, nodes3...)
			var down, up latencies
			for i := 0; b.Loop(); i++ {
				phase(i)
				e.sim.SetRequestHook(tc.hook)
				start := time.Now()
				waitZones(b, e.a, hypervisors.EventZoneDown, nodes3...)
				down.add(time.Since(start))
				phase(i + 5)
				e.sim.SetRequestHook(nil)
				start = time.Now()
				waitZones(b, e.a, hypervisors.EventZoneUp, nodes3...)
				up.add(time.Since(start))
			}
			down.report(b, "s-to-down")
			up.report(b, "s-to-up")
		})
	}
}
