//go:build ha

package ha

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
)

// createShape is what one acknowledged Create wrote to etcd: the size of
// each key and value of its txn (the writer key included), read from a
// watch of the prefix.
type createShape struct {
	keys, values []int
}

func (sh createShape) String() string {
	n := 0
	for i := range sh.keys {
		n += sh.keys[i] + sh.values[i]
	}
	return fmt.Sprintf("%d puts, %d key and value bytes", len(sh.keys), n)
}

var (
	shapeMu sync.Mutex
	shapes  = map[bool]createShape{}
)

// benchShape acknowledges Creates on the bench replicas while watching
// their prefix and returns the shape of the txn that carried the last
// one: after one Create alone (alone), or after 200 in a row from one
// client (steady), when each Create's txn also carries what the
// reconciler wrote for the one before (its completion and history, and
// the simulator's world records), as in BenchmarkHACreateAck.
func benchShape(b *testing.B, s *replicaSet, steady bool) createShape {
	shapeMu.Lock()
	defer shapeMu.Unlock()
	if sh, ok := shapes[steady]; ok {
		return sh
	}
	cl := s.cluster.Client(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := 1
	if steady {
		n = 200
	}
	ids := take(b, n)
	c := s.client(s.waitLeader(b))
	head, err := cl.Get(ctx, s.prefix+"/writer")
	if err != nil {
		b.Fatal(err)
	}
	// Watched from before the first: no pause before the last Create.
	wch := cl.Watch(ctx, s.prefix+"/", clientv3.WithPrefix(), clientv3.WithRev(head.Header.Revision+1))
	for _, id := range ids {
		if _, err := c.Create(ctx, &pb.CreateRequest{MachineId: id}); err != nil {
			b.Fatal(err)
		}
	}
	id := ids[n-1]
	// The first txn that holds the machine's record is its Create's.
	for wr := range wch {
		for _, ev := range wr.Events {
			if strings.HasSuffix(string(ev.Kv.Key), "/m/"+id) {
				var sh createShape
				for _, e := range wr.Events {
					if e.Kv.ModRevision == ev.Kv.ModRevision {
						sh.keys = append(sh.keys, len(e.Kv.Key))
						sh.values = append(sh.values, len(e.Kv.Value))
					}
				}
				shapes[steady] = sh
				return sh
			}
		}
	}
	b.Fatal("the Create's txn was never seen")
	return createShape{}
}

// BenchmarkHABareTxn is etcd's own cost of what one Create writes, on the
// cluster the bench replicas use, in the same run: a txn of the same puts
// (same key and value sizes) guarded the way the store guards its txns
// (an election key's create revision and the writer key's mod revision,
// with the same Else reads), from 1 and from 16 clients, each client its
// own writer chain. Two shapes: a Create alone, and a Create in a
// one-client stream (shape=steady), whose txn also carries the
// reconciler's records for the Create before it (what
// BenchmarkHACreateAck's txns hold). Compare with BenchmarkHACreateAck
// and BenchmarkHAMutations16.
func BenchmarkHABareTxn(b *testing.B) {
	for _, bc := range []struct {
		clients int
		steady  bool
	}{{1, false}, {1, true}, {16, false}} {
		clients := bc.clients
		shape := "alone"
		if bc.steady {
			shape = "steady"
		}
		b.Run(fmt.Sprintf("shape=%s/clients=%d", shape, clients), func(b *testing.B) {
			s := benchReplicas(b)
			sh := benchShape(b, s, bc.steady)
			ctx := context.Background()
			cl := s.cluster.Client(b)
			pfx := fmt.Sprintf("/ha/bare-%d-%d", clients, time.Now().UnixNano())
			election := pfx + "/election"
			put, err := cl.Put(ctx, election, "x")
			if err != nil {
				b.Fatal(err)
			}
			guardRev := put.Header.Revision
			pad := func(n int, s string) string {
				n = max(n, 0)
				if len(s) >= n {
					return s[:n]
				}
				return s + strings.Repeat("k", n-len(s))
			}
			var next atomic.Int64
			var mu sync.Mutex
			var lat []time.Duration
			var wg sync.WaitGroup
			b.ResetTimer()
			t0 := time.Now()
			for w := range clients {
				wg.Go(func() {
					writer := fmt.Sprintf("%s/writer-%d", pfx, w)
					var writerRev int64
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						var then []clientv3.Op
						for j := range sh.keys {
							// Distinct keys of the Create's key sizes: the
							// part that tells them apart comes last and is
							// never cut off (a key shorter than it runs a few
							// bytes longer).
							tail := fmt.Sprintf("/%d/%d/%d", w, i%1000, j)
							k := pad(sh.keys[j]-len(tail), pfx+"/state/") + tail
							if j == len(sh.keys)-1 {
								k = writer
							}
							then = append(then, clientv3.OpPut(k, strings.Repeat("v", sh.values[j])))
						}
						start := time.Now()
						resp, err := cl.Txn(ctx).
							If(clientv3.Compare(clientv3.CreateRevision(election), "=", guardRev),
								clientv3.Compare(clientv3.ModRevision(writer), "=", writerRev)).
							Then(then...).
							Else(clientv3.OpGet(writer), clientv3.OpGet(election)).
							Commit()
						d := time.Since(start)
						if err != nil || !resp.Succeeded {
							b.Errorf("bare txn: %v (succeeded %t)", err, err == nil && resp.Succeeded)
							return
						}
						writerRev = resp.Header.Revision
						mu.Lock()
						lat = append(lat, d)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			el := time.Since(t0)
			b.StopTimer()
			b.ReportMetric(ms(pct(lat, 0.50)), "ms-p50")
			b.ReportMetric(ms(pct(lat, 0.99)), "ms-p99")
			b.ReportMetric(float64(b.N)/el.Seconds(), "txns/s")
			fmt.Fprintf(os.Stderr, "bare guarded txn of a Create %s (%s), %d clients: p50 %v p99 %v, %.0f txns/s\n",
				shape, sh, clients, pct(lat, 0.5).Round(10*time.Microsecond), pct(lat, 0.99).Round(10*time.Microsecond), float64(b.N)/el.Seconds())
		})
	}
}
