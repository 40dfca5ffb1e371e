//go:build ha

package ha

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/etcdtest"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// scaleEnv enables the fleets above 100,000 machines in BenchmarkHAScale
// (make bench-scale sets it).
const scaleEnv = "BIGFLEET_BENCH_SCALE"

func rssMiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			v, _ := strconv.ParseFloat(strings.Fields(line)[1], 64)
			return v / 1024
		}
	}
	return -1
}

// rawBytes is a codec that hands the client the wire bytes, so the List
// below is timed as call plus an explicit decode.
type rawBytes struct{}

func (rawBytes) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawBytes) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawBytes) Name() string { return "proto" }

// BenchmarkHAScale is e2e's BenchmarkScale on an etcd state (three
// embedded members, one replica): time until the replica serves (cold:
// it writes the whole fleet into etcd; warm: it loads it), its resident
// memory, a full List and durable Create acks (p50, p99 of 200). Run it
// with -benchtime 1x; a million machines only with BIGFLEET_BENCH_SCALE=1.
func BenchmarkHAScale(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("machines=%d", n), func(b *testing.B) {
			if n > 100_000 && os.Getenv(scaleEnv) == "" {
				b.Skipf("set %s=1 to start %d machines", scaleEnv, n)
			}
			var cold, warm, list, p50, p99 time.Duration
			var rss, rssList float64
			for range b.N {
				c := etcdtest.Start(b, etcdtest.Options{})
				s := &replicaSet{t: b, cluster: c, prefix: "/ha/scale"}
				start := func() time.Duration {
					t0 := time.Now()
					s.reps = []*providertest.Provider{providertest.Start(b, binary, providertest.Options{
						Args: []string{"serve", "--use-fake-backend", "--state", c.URL(s.prefix), "--log-level", "info",
							"--seed-count", strconv.Itoa(n)},
						WaitPath: "/healthz", ReadyTimeout: 30 * time.Minute,
						Dial: []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1 << 31))},
					})}
					for deadline := time.Now().Add(30 * time.Minute); len(s.serving()) != 1; time.Sleep(50 * time.Millisecond) {
						if time.Now().After(deadline) {
							b.Fatalf("no replica of %d machines serves", n)
						}
					}
					return time.Since(t0)
				}
				cold += start()
				s.reps[0].Terminate()
				warm += start()
				p := s.reps[0]
				rss = rssMiB(p.Pid())

				req, _ := proto.Marshal(&pb.ListFilter{})
				const lists = 3
				for range lists {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
					var raw []byte
					t0 := time.Now()
					if err := p.Conn().Invoke(ctx, "/bigfleet.v1alpha1.CapacityProvider/List", &req, &raw, grpc.ForceCodec(rawBytes{})); err != nil {
						b.Fatal(err)
					}
					var l pb.MachineList
					if err := proto.Unmarshal(raw, &l); err != nil {
						b.Fatal(err)
					}
					list += time.Since(t0) / lists
					cancel()
					if len(l.Machines) != n {
						b.Fatalf("listed %d machines, want %d", len(l.Machines), n)
					}
				}
				rssList = rssMiB(p.Pid())

				targets := ids(s.list(b, providertest.StSpeculative))[:200]
				_, lat := providertest.CreateAll(b, []pb.CapacityProviderClient{p.Client()}, targets)
				p50 += pct(lat, 0.50)
				p99 += pct(lat, 0.99)
				p.Kill()
			}
			f := float64(b.N)
			b.ReportMetric(cold.Seconds()/f, "s-serving-cold")
			b.ReportMetric(warm.Seconds()/f, "s-serving-warm")
			b.ReportMetric(rss, "MiB-RSS")
			b.ReportMetric(rssList, "MiB-RSS-after-List")
			b.ReportMetric(float64(list.Milliseconds())/f, "ms-List-full")
			b.ReportMetric(ms(p50)/f, "ms-Create-ack-p50")
			b.ReportMetric(ms(p99)/f, "ms-Create-ack-p99")
		})
	}
}
