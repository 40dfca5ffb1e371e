package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// scaleEnv enables the fleets above 100,000 machines in BenchmarkScale
// (make bench-scale sets it): a million machines take minutes and GiBs.
const scaleEnv = "BIGFLEET_BENCH_SCALE"

// scaleCase is one fleet BenchmarkScale starts.
type scaleCase struct {
	name string
	// machines in all; labelBytes of labels on each (an offerings file).
	machines, labelBytes int
	big                  bool // only with scaleEnv set
}

var scaleCases = []scaleCase{
	{name: "machines=100000", machines: 100_000},
	{name: "machines=1000000", machines: 1_000_000, big: true},
	{name: "machines=250000,labels=1KiB", machines: 250_000, labelBytes: 1024, big: true},
}

// scaleArgs are the flags that start the fleet of c on the file state at
// dir (an offerings file when the slots carry labels).
func scaleArgs(tb testing.TB, c scaleCase, dir string) []string {
	if c.labelBytes == 0 {
		return []string{"--seed-count", strconv.Itoa(c.machines)}
	}
	// Two zones, as --seed-count makes, with labels of labelBytes each.
	label := strings.Repeat("l", c.labelBytes-len("team"))
	var offerings []map[string]any
	for _, zone := range []string{"local-a", "local-b"} {
		offerings = append(offerings, map[string]any{"instance_type": "kvm.small", "zone": zone, "count": c.machines / 2,
			"labels": map[string]string{"team": label}})
	}
	raw, err := json.Marshal(offerings)
	if err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(dir, "offerings.json")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		tb.Fatal(err)
	}
	return []string{"--offerings", path}
}

// BenchmarkScale starts each fleet on a fresh file state (--state) and
// reports what the documented cap costs: time to ready (cold: the state is
// created; warm: it is loaded), resident memory once ready, a full List
// (call plus the client's decode) and the latency of durable Create acks
// (p50 and p99 of 200, one at a time). Run it with -benchtime 1x; the
// fleets above 100,000 only with BIGFLEET_BENCH_SCALE=1 (make bench-scale).
func BenchmarkScale(b *testing.B) {
	for _, c := range scaleCases {
		b.Run(c.name, func(b *testing.B) {
			if c.big && os.Getenv(scaleEnv) == "" {
				b.Skipf("set %s=1 to start %d machines", scaleEnv, c.machines)
			}
			var cold, warm, list time.Duration
			var rss, rssList float64
			var p50, p99 time.Duration
			for range b.N {
				dir := b.TempDir()
				args := append(scaleArgs(b, c, dir), "--state", filepath.Join(dir, "state"))
				opts := providertest.Options{ReadyTimeout: 30 * time.Minute}
				s := startWith(b, opts, args)
				cold += s.TimeToReady()
				s.Terminate()
				s = startWith(b, opts, args)
				warm += s.TimeToReady()
				rss = rssKiB(s.Pid()) / 1024

				req, _ := proto.Marshal(&pb.ListFilter{})
				const lists = 3
				for range lists {
					var raw []byte
					t0 := time.Now()
					if err := s.Conn().Invoke(ctx(b), "/bigfleet.v1alpha1.CapacityProvider/List", &req, &raw, grpc.ForceCodec(providertest.RawCodec{})); err != nil {
						b.Fatal(err)
					}
					var l pb.MachineList
					if err := proto.Unmarshal(raw, &l); err != nil {
						b.Fatal(err)
					}
					list += time.Since(t0) / lists
					if len(l.Machines) != c.machines {
						b.Fatalf("listed %d machines, want %d", len(l.Machines), c.machines)
					}
				}
				rssList = rssKiB(s.Pid()) / 1024

				targets := providertest.IDs(providertest.ListAll(b, s.c, providertest.StSpeculative))[:200]
				_, lat := providertest.CreateAll(b, []pb.CapacityProviderClient{s.c}, targets)
				p50 += pct(lat, 0.50)
				p99 += pct(lat, 0.99)
				s.Kill()
			}
			n := float64(b.N)
			b.ReportMetric(cold.Seconds()/n, "s-ready-cold")
			b.ReportMetric(warm.Seconds()/n, "s-ready-warm")
			b.ReportMetric(rss, "MiB-RSS")
			b.ReportMetric(rssList, "MiB-RSS-after-List")
			b.ReportMetric(float64(list.Milliseconds())/n, "ms-List-full")
			b.ReportMetric(float64(p50.Microseconds())/1000/n, "ms-Create-ack-p50")
			b.ReportMetric(float64(p99.Microseconds())/1000/n, "ms-Create-ack-p99")
		})
	}
}
