package etcdstore

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/internal/etcdtest"
)

// reportLatency reports the p50 and p99 of ds as metrics.
func reportLatency(b *testing.B, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	b.ReportMetric(ms(pctOf(ds, 0.50)), "p50-ms")
	b.ReportMetric(ms(pctOf(ds, 0.99)), "p99-ms")
	b.ReportMetric(ms(ds[len(ds)-1]), "max-ms")
}

// pctOf is the p-th quantile of sorted ds.
func pctOf(ds []time.Duration, p float64) time.Duration {
	return ds[min(len(ds)-1, int(p*float64(len(ds))))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkCommit measures the latency of one small batch (a machine
// record of ~600 bytes plus the document's meta key) on a three-member
// loopback cluster, with 1 and 16 goroutines committing at once.
func BenchmarkCommit(b *testing.B) {
	c := etcdtest.Start(b, etcdtest.Options{})
	for _, committers := range []int{1, 16} {
		b.Run(fmt.Sprintf("committers=%d", committers), func(b *testing.B) {
			_, _, s := leader(b, c, fmt.Sprintf("/bench-commit-%d", committers), Options{})
			var mu sync.Mutex
			var lat []time.Duration
			var wg sync.WaitGroup
			work := make(chan int)
			b.ResetTimer()
			for w := range committers {
				wg.Go(func() {
					done := make(chan error, 1)
					for i := range work {
						start := time.Now()
						s.Commit([]Op{
							{Key: fmt.Sprintf("m/%d-%d", w, i%1000), Value: value(i, 600)},
							{Key: "meta/doc", Value: value(i, 80)},
						}, func(err error) { done <- err })
						if err := <-done; err != nil {
							b.Error(err)
							return
						}
						d := time.Since(start)
						mu.Lock()
						lat = append(lat, d)
						mu.Unlock()
					}
				})
			}
			for i := range b.N {
				work <- i
			}
			close(work)
			wg.Wait()
			b.StopTimer()
			reportLatency(b, lat)
		})
	}
}

// BenchmarkLoad measures Load of 100,000 values of 600 bytes, the state
// of a 100,000-machine fleet, as a new leader does at takeover.
func BenchmarkLoad(b *testing.B) {
	c := etcdtest.Start(b, etcdtest.Options{})
	cl, term, s := leader(b, c, "/bench-load", Options{})
	const n = 100_000
	ops := make([]Op, n)
	for i := range ops {
		ops[i] = Op{Key: fmt.Sprintf("m/%06d", i), Value: value(i, 600)}
	}
	if err := commit(b, s, ops...); err != nil {
		b.Fatal(err)
	}
	for _, page := range []int{1024, DefaultLoadPageSize, 16384} {
		b.Run(fmt.Sprintf("page=%d", page), func(b *testing.B) {
			s := openStore(b, cl, "/bench-load", term, Options{LoadPageSize: page})
			b.ResetTimer()
			for range b.N {
				m, err := s.Load(context.Background())
				if err != nil {
					b.Fatal(err)
				}
				if len(m) != n {
					b.Fatalf("loaded %d keys, want %d", len(m), n)
				}
			}
		})
	}
}

// BenchmarkFirstWrite measures one batch of 100,000 values of 600 bytes,
// split across txns of at most 127 puts (etcd's default --max-txn-ops):
// a whole fleet's first write, with 1, 4 (the default) and 8 chunk txns
// in flight.
func BenchmarkFirstWrite(b *testing.B) {
	c := etcdtest.Start(b, etcdtest.Options{})
	const n = 100_000
	ops := make([]Op, n)
	for j := range ops {
		ops[j] = Op{Key: fmt.Sprintf("m/%06d", j), Value: value(j, 600)}
	}
	for _, par := range []int{1, DefaultChunkParallel, 8} {
		b.Run(fmt.Sprintf("parallel=%d", par), func(b *testing.B) {
			b.StopTimer()
			for i := range b.N {
				_, _, s := leader(b, c, fmt.Sprintf("/bench-first-%d-%d", par, i), Options{ChunkParallel: par})
				b.StartTimer()
				if err := commitWithin(b, s, 10*time.Minute, ops...); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
			}
		})
	}
}

// BenchmarkTakeover measures how long a standby needs to lead after the
// leader's session dies: its lease revoked (a crashed leader whose
// session a tool or operator removed, or a graceful exit), or left to
// expire (the leader vanished; its client is closed without a revoke).
func BenchmarkTakeover(b *testing.B) {
	c := etcdtest.Start(b, etcdtest.Options{})
	for _, tc := range []struct {
		mode string
		ttl  time.Duration
	}{{"revoke", testTTL}, {"expire", testTTL}, {"expire", DefaultTTL}} {
		b.Run(fmt.Sprintf("%s/ttl=%v", tc.mode, tc.ttl), func(b *testing.B) {
			mode := tc.mode
			var ds []time.Duration
			for i := range b.N {
				prefix := fmt.Sprintf("/bench-takeover-%s-%v-%d", mode, tc.ttl, i)
				cla := newClient(b, c)
				a := newElector(b, cla, prefix, "a", tc.ttl)
				ta, err := a.Campaign(context.Background())
				if err != nil {
					b.Fatal(err)
				}
				clb := newClient(b, c)
				standby := newElector(b, clb, prefix, "b", tc.ttl)
				won := make(chan *Term, 1)
				go func() {
					tb, err := standby.Campaign(context.Background())
					if err != nil {
						b.Error(err)
					}
					won <- tb
				}()
				waitCandidates(b, clb, prefix, 2)
				start := time.Now()
				switch mode {
				case "revoke":
					if _, err := clb.Revoke(context.Background(), ta.Lease()); err != nil {
						b.Fatal(err)
					}
				case "expire":
					cla.Close()
				}
				tb := <-won
				ds = append(ds, time.Since(start))
				if tb != nil {
					tb.Resign(context.Background())
				}
			}
			reportLatency(b, ds)
		})
	}
}
