package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// The benchmarks share one provider with 100,000 seeded machines and a
// durable state file; TestMain stops it.
const benchMachines = 100000

var (
	benchOnce sync.Once
	benchSrv  *server
	benchDir  string
	benchPool struct {
		sync.Mutex
		ids []string
	}
)

func benchServer(b *testing.B) *server {
	benchOnce.Do(func() {
		dir, err := os.MkdirTemp("", "provider-bench-")
		if err != nil {
			b.Fatal(err)
		}
		benchDir = dir
		benchSrv = startWith(b, providertest.Options{Detached: true},
			[]string{"--seed-count", strconv.Itoa(benchMachines), "--state", filepath.Join(dir, "state")})
		benchPool.ids = providertest.IDs(providertest.ListAll(b, benchSrv.c, providertest.StSpeculative))
	})
	if benchSrv == nil {
		b.Fatal("bench server failed to start")
	}
	benchSrv.Bind(b)
	return benchSrv
}

// stopBench is called by TestMain after the run.
func stopBench() {
	if benchSrv != nil {
		benchSrv.Kill()
		os.RemoveAll(benchDir)
	}
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

func rssKiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[1], 64)
			return v
		}
	}
	return -1
}

func pct(d []time.Duration, p float64) time.Duration { return providertest.Percentile(d, p) }

// waitQuiet waits until no machine is in a transitional state.
func waitQuiet(b *testing.B, s *server) {
	for end := time.Now().Add(5 * time.Minute); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if len(providertest.ListAll(b, s.c, providertest.StCreating, providertest.StConfiguring, providertest.StDraining, providertest.StDeleting)) == 0 {
			return
		}
	}
	b.Fatal("transitions never settled")
}

// BenchmarkStartup measures time to /readyz with 100k machines: cold (a
// fresh state file is created) and warm (the same state is loaded), and
// the server's RSS once ready.
func BenchmarkStartup(b *testing.B) {
	for _, mode := range []string{"cold", "warm"} {
		b.Run(mode, func(b *testing.B) {
			var ready time.Duration
			var rss float64
			for range b.N {
				b.StopTimer()
				state := filepath.Join(b.TempDir(), "state")
				args := []string{"--seed-count", strconv.Itoa(benchMachines), "--state", state}
				if mode == "warm" {
					start(b, args...).Terminate()
				}
				b.StartTimer()
				s := start(b, args...)
				b.StopTimer()
				ready += s.TimeToReady()
				rss = rssKiB(s.Pid())
				s.Kill()
			}
			b.ReportMetric(ready.Seconds()/float64(b.N), "s/ready")
			b.ReportMetric(rss/1024, "MiB-RSS")
		})
	}
}

// BenchmarkCreateAck measures the latency of one durable Create ack.
func BenchmarkCreateAck(b *testing.B) {
	s := benchServer(b)
	targets := take(b, b.N)
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		if _, err := create(s.c, b, targets[i], tok{}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	b.ReportMetric(float64(pct(lat, 0.50).Microseconds())/1000, "ms-p50")
	b.ReportMetric(float64(pct(lat, 0.99).Microseconds())/1000, "ms-p99")
}

// BenchmarkDurableMutations16 runs Creates from 16 concurrent clients, each
// on its own connection; every ack is durable.
func BenchmarkDurableMutations16(b *testing.B) {
	const workers = 16
	s := benchServer(b)
	targets := take(b, b.N)
	clients := make([]pb.CapacityProviderClient, workers)
	for i := range clients {
		clients[i] = s.Dial()
	}
	b.ResetTimer()
	el, _ := providertest.CreateAll(b, clients, targets)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/el.Seconds(), "mutations/s")
}

// BenchmarkListFull lists all 100k machines. e2e is the call plus the
// client's decode; decode is measured on its own from the raw bytes; the
// rest (server plus transport) is the server share.
func BenchmarkListFull(b *testing.B) {
	s := benchServer(b)
	req, _ := proto.Marshal(&pb.ListFilter{})
	var total, decode time.Duration
	n := 0
	b.ResetTimer()
	for range b.N {
		var raw []byte
		t0 := time.Now()
		if err := s.Conn().Invoke(ctx(b), "/bigfleet.v1alpha1.CapacityProvider/List", &req, &raw, grpc.ForceCodec(providertest.RawCodec{})); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		var l pb.MachineList
		if err := proto.Unmarshal(raw, &l); err != nil {
			b.Fatal(err)
		}
		total += time.Since(t0)
		decode += time.Since(t1)
		n = len(l.Machines)
	}
	b.StopTimer()
	if n != benchMachines {
		b.Errorf("listed %d machines, want %d", n, benchMachines)
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	b.ReportMetric(per(total), "ms-e2e")
	b.ReportMetric(per(decode), "ms-client-decode")
	b.ReportMetric(per(total-decode), "ms-server+transport")
}

// BenchmarkListDelta20 lists the 20 machines changed since a cursor.
func BenchmarkListDelta20(b *testing.B) {
	s := benchServer(b)
	waitQuiet(b, s)
	cur := list(b, s.c, &pb.ListFilter{}).Revision
	for _, id := range take(b, 20) {
		if _, err := create(s.c, b, id, tok{}); err != nil {
			b.Fatal(err)
		}
	}
	waitQuiet(b, s)
	n := 0
	b.ResetTimer()
	for range b.N {
		n = len(list(b, s.c, &pb.ListFilter{SinceRevision: cur}).Machines)
	}
	b.StopTimer()
	if n != 20 {
		b.Errorf("delta holds %d machines, want 20", n)
	}
}

// BenchmarkWalkToIdle16 walks machines SPECULATIVE -> IDLE with 16 workers
// (Create, then poll Get every 2 ms until IDLE). Besides the rate it
// reports where a walk's time goes: the mean Create ack (the intent made
// durable), the mean time from that ack until a Get shows IDLE (the
// reconciler's work plus the completion made durable, since neither is
// visible before), the Gets a walk took, the group commits a walk cost
// and the CPU a walk cost in the provider and in this process (the
// clients), whose sum on 2 cores bounds the rate once the cores are busy.
func BenchmarkWalkToIdle16(b *testing.B) { walkToIdle(b, 16) }

// BenchmarkWalkToIdle1 is the same walk from one worker: the latency of a
// walk on cores that are not busy.
func BenchmarkWalkToIdle1(b *testing.B) { walkToIdle(b, 1) }

func walkToIdle(b *testing.B, workers int) {
	s := benchServer(b)
	waitQuiet(b, s)
	targets := take(b, b.N)
	clients := make([]pb.CapacityProviderClient, workers)
	for i := range clients {
		clients[i] = s.Dial()
	}
	var next, ackNs, idleNs, gets atomic.Int64
	var wg sync.WaitGroup
	const commits = "bigfleet_provider_state_commits_total"
	const mallocs, allocBytes = "go_memstats_mallocs_total", "go_memstats_alloc_bytes_total"
	body0 := s.metrics()
	commits0, mallocs0, bytes0 := providertest.Metric(body0, commits), providertest.Metric(body0, mallocs), providertest.Metric(body0, allocBytes)
	cpu0, self0 := providertest.CPUSeconds(b, s.Pid()), providertest.CPUSeconds(b, os.Getpid())
	profiled := profileProvider(b, s, fmt.Sprintf("walk%d-%d", workers, b.N))
	b.ResetTimer()
	t0 := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[w]
			for {
				i := int(next.Add(1)) - 1
				if i >= len(targets) {
					return
				}
				began := time.Now()
				if _, err := create(c, b, targets[i], tok{}); err != nil {
					b.Error(err)
					return
				}
				acked := time.Now()
				ackNs.Add(int64(acked.Sub(began)))
				for {
					gets.Add(1)
					m, err := c.Get(ctx(b), &pb.MachineRef{Id: targets[i]})
					if err != nil || m.State == providertest.StFailed {
						b.Errorf("walk %s: %v %v", targets[i], m.GetState(), err)
						return
					}
					if m.State == providertest.StIdle {
						idleNs.Add(int64(time.Since(acked)))
						break
					}
					time.Sleep(2 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(t0)
	b.StopTimer()
	cpu1 := providertest.CPUSeconds(b, s.Pid())
	body1 := s.metrics()
	profiled()
	n := float64(b.N)
	b.ReportMetric(n/el.Seconds(), "machines/s")
	b.ReportMetric(float64(ackNs.Load())/1e6/n, "ms-ack")
	b.ReportMetric(float64(idleNs.Load())/1e6/n, "ms-ack-to-idle")
	b.ReportMetric(float64(gets.Load())/n, "gets/walk")
	b.ReportMetric((providertest.Metric(body1, commits)-commits0)/n, "commits/walk")
	b.ReportMetric((cpu1-cpu0)*1e3/n, "ms-cpu-provider/walk")
	// The provider's heap allocations per walk (exact counts from its Go
	// runtime, one /metrics scrape at each end): far less noisy than CPU.
	b.ReportMetric((providertest.Metric(body1, mallocs)-mallocs0)/n, "allocs-provider/walk")
	b.ReportMetric((providertest.Metric(body1, allocBytes)-bytes0)/n, "B-provider/walk")
	b.ReportMetric((providertest.CPUSeconds(b, os.Getpid())-self0)*1e3/n, "ms-cpu-clients/walk")
}

// BenchmarkServerRSS reports the shared server's resident memory after
// the other benchmarks ran against it.
func BenchmarkServerRSS(b *testing.B) {
	s := benchServer(b)
	for range b.N {
		providertest.Get(b, s.c, benchPool.ids[0])
	}
	b.ReportMetric(rssKiB(s.Pid())/1024, "MiB-RSS")
}
