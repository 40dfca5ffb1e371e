//go:build ha

package ha

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/etcdtest"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// The benchmarks share two replicas of a 100,000-machine fleet on one
// three-member etcd cluster (default lease); TestMain stops them. Their
// local-journal counterparts are e2e's BenchmarkCreateAck and
// BenchmarkDurableMutations16.
const benchMachines = 100000

// benchCompaction is the members' periodic compaction retention: what
// docs/high-availability.md asks of production clusters, and never within
// a run. The suites' 10 s (etcdtest.CompactionRetention) compacts the
// 100,000-machine keyspace every 10 s, which cost the members about 0.7 ms
// of CPU per Create in BenchmarkHACreateAck and landed in one benchmark's
// window and not another's.
const benchCompaction = "1h"

// benchStartWait bounds the first leader's start: it writes the whole
// fleet into etcd.
const benchStartWait = 10 * time.Minute

var (
	benchOnce sync.Once
	benchSet  *replicaSet
	// benchStop releases what the benchmarks share (set when they start it).
	benchStop func()
	benchPool struct {
		sync.Mutex
		ids []string
	}
)

// stopBench is called by TestMain after the run.
func stopBench() {
	if benchStop != nil {
		benchStop()
	}
}

func benchReplicas(b *testing.B) *replicaSet {
	benchOnce.Do(func() {
		c, err := etcdtest.New(etcdtest.Options{CompactionRetention: benchCompaction})
		if err != nil {
			b.Fatal(err)
		}
		s := &replicaSet{t: b, cluster: c, prefix: "/ha/bench"}
		benchStop = func() {
			for _, p := range s.reps {
				p.Kill()
			}
			c.Close()
		}
		for range 2 {
			s.reps = append(s.reps, providertest.Start(b, binary, providertest.Options{
				Args: append([]string{"serve", "--use-fake-backend", "--state", c.URL(s.prefix), "--log-level", "info",
					"--seed-count", strconv.Itoa(benchMachines)}, strings.Fields(os.Getenv("HA_BENCH_ARGS"))...),
				WaitPath: "/healthz", ReadyTimeout: benchStartWait, Detached: true,
				Dial: []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1 << 30))},
			}))
		}
		for deadline := time.Now().Add(benchStartWait); len(s.serving()) != 1; time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatalf("no replica of %d machines leads after %v", benchMachines, benchStartWait)
			}
		}
		benchPool.ids = ids(s.list(b, providertest.StSpeculative))
		benchSet = s
	})
	if benchSet == nil {
		b.Fatal("the benchmark replicas failed to start")
	}
	benchSet.t = b
	for _, p := range benchSet.reps {
		p.Bind(b)
	}
	return benchSet
}

func ids(ms []*pb.Machine) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Id
	}
	return out
}

// take hands out n SPECULATIVE machines never used by another benchmark.
func take(b *testing.B, n int) []string {
	benchPool.Lock()
	defer benchPool.Unlock()
	if n > len(benchPool.ids) {
		b.Fatalf("bench pool exhausted: want %d, have %d", n, len(benchPool.ids))
	}
	out := benchPool.ids[:n]
	benchPool.ids = benchPool.ids[n:]
	return out
}

func pct(d []time.Duration, p float64) time.Duration { return providertest.Percentile(d, p) }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// callWait bounds one timed call of a benchmark.
const callWait = time.Minute

// timed makes call with callWait's deadline, appends its latency to lat
// and returns lat; a failed call ends the benchmark.
func timed(b *testing.B, lat []time.Duration, call func(context.Context) error) []time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), callWait)
	defer cancel()
	t0 := time.Now()
	err := call(ctx)
	lat = append(lat, time.Since(t0))
	if err != nil {
		b.Fatal(err)
	}
	return lat
}

// BenchmarkHACreateAck measures one Create acknowledged by the leader:
// committed to etcd (three members, guarded txn) before the answer.
func BenchmarkHACreateAck(b *testing.B) {
	s := benchReplicas(b)
	leader := s.waitLeader(b)
	c := s.client(leader)
	targets := take(b, b.N)
	lat := make([]time.Duration, 0, b.N)
	before := etcdRev(b, s.cluster.Client(b), s.prefix+"/writer")
	profiled := profileLeader(b, s.reps[leader], fmt.Sprintf("createack-%d", b.N))
	split := splitOf(s, leader)
	here := profileHere(b, fmt.Sprintf("createack-%d", b.N))
	b.ResetTimer()
	for i := range b.N {
		lat = timed(b, lat, func(ctx context.Context) error {
			_, err := c.Create(ctx, &pb.CreateRequest{MachineId: targets[i]})
			return err
		})
	}
	b.StopTimer()
	here()
	profiled()
	b.ReportMetric(ms(pct(lat, 0.50)), "ms-p50")
	b.ReportMetric(ms(pct(lat, 0.99)), "ms-p99")
	// Everything the leader committed meanwhile (the Creates and the
	// reconciler's work on them), per Create.
	b.ReportMetric(float64(etcdRev(b, s.cluster.Client(b), s.prefix+"/writer")-before)/float64(b.N), "txns/create")
	split(b)
}

// splitOf starts splitting the leader's Create time: read after the run,
// it reports the mean time the leader's handler took per Create
// (grpc_server_handling_seconds) and the mean time its store's txns took
// from send to commit (state_fsync_duration_seconds), so that their
// difference is the provider's own part of an acknowledgement and the
// client's mean minus the handler's is the gRPC hop. It also reports the
// CPU each Create cost the leader, the standby and this process (the
// three etcd members and the client), to set against what a bare txn
// costs this process (BenchmarkHABareTxn).
func splitOf(s *replicaSet, leader int) func(*testing.B) {
	type sums struct{ handler, handled, txn, txns, gcs, gcPause, cpuLeader, cpuStandby, cpuHere float64 }
	read := func() sums {
		_, body := s.reps[leader].HTTPGet("/metrics")
		create := `grpc_method="Create"`
		su := sums{
			handler:   providertest.Metric(body, "grpc_server_handling_seconds_sum", create),
			handled:   providertest.Metric(body, "grpc_server_handling_seconds_count", create),
			txn:       providertest.Metric(body, "bigfleet_provider_state_fsync_duration_seconds_sum"),
			txns:      providertest.Metric(body, "bigfleet_provider_state_fsync_duration_seconds_count"),
			gcs:       providertest.Metric(body, "go_gc_duration_seconds_count"),
			gcPause:   providertest.Metric(body, "go_gc_duration_seconds_sum"),
			cpuLeader: providertest.CPUSeconds(s.t, s.reps[leader].Pid()),
			cpuHere:   providertest.CPUSeconds(s.t, os.Getpid()),
		}
		for i, p := range s.reps {
			if i != leader {
				su.cpuStandby += providertest.CPUSeconds(s.t, p.Pid())
			}
		}
		return su
	}
	before := read()
	return func(b *testing.B) {
		after := read()
		n := after.handled - before.handled
		if n > 0 {
			b.ReportMetric((after.handler-before.handler)/n*1000, "ms-handler-mean")
			b.ReportMetric((after.cpuLeader-before.cpuLeader)/n*1000, "ms-cpu-leader/op")
			b.ReportMetric((after.cpuStandby-before.cpuStandby)/n*1000, "ms-cpu-standby/op")
			b.ReportMetric((after.cpuHere-before.cpuHere)/n*1000, "ms-cpu-etcd+client/op")
			b.ReportMetric((after.gcs-before.gcs)/n*1000, "leader-gcs/1000ops")
			if g := after.gcs - before.gcs; g > 0 {
				b.ReportMetric((after.gcPause-before.gcPause)/g*1000, "ms-leader-gc-pause/gc")
			}
		}
		if n := after.txns - before.txns; n > 0 {
			b.ReportMetric((after.txn-before.txn)/n*1000, "ms-txn-mean")
		}
	}
}

// BenchmarkHAGetHop measures a Get on the leader from one client: the
// gRPC round trip, the interceptors and a read of the committed document,
// without etcd. With BenchmarkHABareTxn it splits BenchmarkHACreateAck
// into the hop a bare txn does not make and the txn itself.
func BenchmarkHAGetHop(b *testing.B) {
	s := benchReplicas(b)
	c := s.client(s.waitLeader(b))
	benchPool.Lock()
	id := benchPool.ids[0] // read, never taken
	benchPool.Unlock()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		lat = timed(b, lat, func(ctx context.Context) error {
			_, err := c.Get(ctx, &pb.MachineRef{Id: id})
			return err
		})
	}
	b.StopTimer()
	b.ReportMetric(ms(pct(lat, 0.50)), "ms-p50")
	b.ReportMetric(ms(pct(lat, 0.99)), "ms-p99")
}

// BenchmarkHAMutations16 runs Creates from 16 concurrent clients, each on
// its own connection to the leader; every ack is committed to etcd.
func BenchmarkHAMutations16(b *testing.B) {
	const workers = 16
	s := benchReplicas(b)
	li := s.waitLeader(b)
	leader := s.reps[li]
	targets := take(b, b.N)
	clients := make([]pb.CapacityProviderClient, workers)
	for i := range clients {
		clients[i] = leader.Dial()
	}
	profiled := profileLeader(b, leader, fmt.Sprintf("mutations16-%d", b.N))
	split := splitOf(s, li)
	here := profileHere(b, fmt.Sprintf("mutations16-%d", b.N))
	b.ResetTimer()
	el, lat := providertest.CreateAll(b, clients, targets)
	b.StopTimer()
	here()
	profiled()
	split(b)
	b.ReportMetric(float64(b.N)/el.Seconds(), "mutations/s")
	b.ReportMetric(ms(pct(lat, 0.50)), "ms-p50")
	b.ReportMetric(ms(pct(lat, 0.99)), "ms-p99")
}

// tookRE finds how long a new leader took from winning the election to
// serving (loading the document and the simulated world from etcd).
var tookRE = regexp.MustCompile(`msg="leading: serving the desired state" machines=\d+ took=(\S+)`)

// loadTime is the took= of the newest "leading: serving" line in out.
func loadTime(b *testing.B, out string) time.Duration {
	m := tookRE.FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		b.Fatal("the new leader logged no \"leading: serving the desired state\"")
	}
	d, err := time.ParseDuration(m[len(m)-1][1])
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// BenchmarkHATakeover kills the leader (-9) b.N times and measures how
// long until the standby reports SERVING (it loads the 100,000-machine
// document first) and until a Create is acknowledged again; the killed
// replica is started again as the standby each time. Reported as
// distributions over the b.N kills, with the part the new leader spent
// loading (from its log) on its own.
func BenchmarkHATakeover(b *testing.B) {
	s := benchReplicas(b)
	targets := take(b, b.N)
	var serving, acked, load []time.Duration
	b.ResetTimer()
	for i := range b.N {
		old, next, t0, took := s.killLeader(b)
		serving = append(serving, took)
		if _, err := s.call(nil, func(ctx context.Context, c pb.CapacityProviderClient) error {
			_, err := c.Create(ctx, &pb.CreateRequest{MachineId: targets[i]})
			return err
		}); err != nil {
			b.Fatal(err)
		}
		acked = append(acked, time.Since(t0))
		b.StopTimer()
		load = append(load, loadTime(b, s.reps[next].Output()))
		s.reps[old].Launch()
		b.StartTimer()
	}
	b.StopTimer()
	for name, d := range map[string][]time.Duration{"serving": serving, "ack": acked, "load": load} {
		b.ReportMetric(pct(d, 0.5).Seconds(), "s-"+name+"-p50")
		b.ReportMetric(pct(d, 0.9).Seconds(), "s-"+name+"-p90")
		b.ReportMetric(pct(d, 1).Seconds(), "s-"+name+"-max")
	}
	fmt.Fprintf(os.Stderr, "takeover of %d machines, kill -9 -> standby SERVING: %s; -> Create acknowledged: %s; of which loading: %s\n",
		benchMachines, dist(serving), dist(acked), dist(load))
}
