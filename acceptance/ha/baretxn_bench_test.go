//go:build ha

package ha

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// createShape is what one acknowledged Create wrote to etcd: the size of
// each key and value of its txn (the writer key included), read from a
// watch of the prefix.
type createShape struct {
	Keys, Values []int
}

func (sh createShape) String() string {
	n := 0
	for i := range sh.Keys {
		n += sh.Keys[i] + sh.Values[i]
	}
	return fmt.Sprintf("%d puts, %d key and value bytes", len(sh.Keys), n)
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
						sh.Keys = append(sh.Keys, len(e.Kv.Key))
						sh.Values = append(sh.Values, len(e.Kv.Value))
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
// BenchmarkHACreateAck's txns hold; at 16 clients, everything one Create
// and the reconciler's work on it write, which BenchmarkHAMutations16's
// group commits carry for each Create). Two places for the clients: in the
// test process, which also hosts the embedded members (from=members), and
// in a process of their own, as the provider is (from=apart: the test
// binary run again as a bare client, see bareChild). And, as the warm
// standby follows the provider's prefix, with a watcher on the run's
// prefix from a client of its own (watched=yes). Compare with
// BenchmarkHACreateAck and BenchmarkHAMutations16.
func BenchmarkHABareTxn(b *testing.B) {
	for _, bc := range []struct {
		clients int
		steady  bool
		apart   bool
		watched bool
	}{{1, false, false, false}, {1, true, false, false}, {16, false, false, false}, {16, true, false, false},
		{1, false, true, false}, {1, true, true, false}, {16, false, true, false}, {16, true, true, false},
		{1, false, false, true}, {16, false, false, true}} {
		shape, from, watched := "alone", "members", "no"
		if bc.steady {
			shape = "steady"
		}
		if bc.apart {
			from = "apart"
		}
		if bc.watched {
			watched = "yes"
		}
		b.Run(fmt.Sprintf("shape=%s/clients=%d/from=%s/watched=%s", shape, bc.clients, from, watched), func(b *testing.B) {
			s := benchReplicas(b)
			run := bareRun{
				Endpoints: s.cluster.Endpoints(),
				Prefix:    fmt.Sprintf("/ha/bare-%d-%s-%d", bc.clients, from, time.Now().UnixNano()),
				Shape:     benchShape(b, s, bc.steady),
				Clients:   bc.clients,
				N:         b.N,
			}
			ctx, cl := context.Background(), s.cluster.Client(b)
			put, err := cl.Put(ctx, run.Prefix+"/election", "x")
			if err != nil {
				b.Fatal(err)
			}
			run.GuardRev = put.Header.Revision
			var events atomic.Int64
			stopWatch := func() {}
			if bc.watched {
				stopWatch = watchPrefix(b, s.cluster.Client(b), run.Prefix, &events)
			}
			var res bareResult
			cpu0 := providertest.CPUSeconds(b, os.Getpid())
			here := profileHere(b, fmt.Sprintf("bare-%s-%d-%s-%s-%d", shape, bc.clients, from, watched, b.N))
			b.ResetTimer()
			if bc.apart {
				res, err = run.inChild(ctx)
			} else {
				res, err = run.txns(ctx, cl)
			}
			b.StopTimer()
			here()
			cpu := providertest.CPUSeconds(b, os.Getpid()) - cpu0
			stopWatch()
			if err != nil {
				b.Fatal(err)
			}
			if bc.watched && events.Load() < int64(b.N) {
				b.Fatalf("the watcher saw %d events of %d txns", events.Load(), b.N)
			}
			lat, el := res.latencies(), time.Duration(res.ElapsedNs)
			b.ReportMetric(ms(pct(lat, 0.50)), "ms-p50")
			b.ReportMetric(ms(pct(lat, 0.99)), "ms-p99")
			b.ReportMetric(float64(b.N)/el.Seconds(), "txns/s")
			if !bc.apart {
				// The three members and the clients (apart, the clients
				// run in a child process of their own).
				b.ReportMetric(cpu*1000/float64(b.N), "ms-cpu-etcd+client/op")
			}
			fmt.Fprintf(os.Stderr, "bare guarded txn of a Create %s (%s), %d clients from %s, watched %s: p50 %v p99 %v, %.0f txns/s\n",
				shape, run.Shape, bc.clients, from, watched, pct(lat, 0.5).Round(10*time.Microsecond), pct(lat, 0.99).Round(10*time.Microsecond), float64(b.N)/el.Seconds())
		})
	}
}

// watchPrefix follows every change under prefix from cl, as the warm
// standby follows the provider's, counting the events into n until the
// returned stop is called; stop returns once the watcher has.
func watchPrefix(b *testing.B, cl *clientv3.Client, prefix string, n *atomic.Int64) (stop func()) {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
	ch := cl.Watch(ctx, prefix+"/", clientv3.WithPrefix())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for resp := range ch {
			if err := resp.Err(); err != nil && ctx.Err() == nil {
				b.Errorf("watch %s: %v", prefix, err)
				return
			}
			n.Add(int64(len(resp.Events)))
		}
	}()
	return func() {
		// Every event is delivered before the watcher stops: wait for
		// the count to settle, bounded, then cancel.
		for last, i := int64(-1), 0; n.Load() != last && i < 100; i++ {
			last = n.Load()
			time.Sleep(20 * time.Millisecond)
		}
		cancel()
		<-done
	}
}

// bareRun is one run of bare guarded txns: what the benchmark hands a
// bare client, in its own process or not.
type bareRun struct {
	Endpoints []string
	Prefix    string // the run's keys live under it; Prefix+"/election" guards them
	GuardRev  int64  // the election key's create revision
	Shape     createShape
	Clients   int
	N         int // txns in all, over every client
}

// bareResult is what a run measured.
type bareResult struct {
	LatencyNs []int64 // one per txn, in no order
	ElapsedNs int64   // first txn sent to last answered
}

func (r bareResult) latencies() []time.Duration {
	out := make([]time.Duration, len(r.LatencyNs))
	for i, ns := range r.LatencyNs {
		out[i] = time.Duration(ns)
	}
	return out
}

// txns sends the run's N txns from Clients goroutines sharing cl, each
// its own writer chain, and times each.
func (run bareRun) txns(ctx context.Context, cl *clientv3.Client) (bareResult, error) {
	sh := run.Shape
	election := run.Prefix + "/election"
	pad := func(n int, s string) string {
		n = max(n, 0)
		if len(s) >= n {
			return s[:n]
		}
		return s + strings.Repeat("k", n-len(s))
	}
	var (
		next  atomic.Int64
		mu    sync.Mutex
		res   bareResult
		first error
		wg    sync.WaitGroup
	)
	t0 := time.Now()
	for w := range run.Clients {
		wg.Go(func() {
			writer := fmt.Sprintf("%s/writer-%d", run.Prefix, w)
			var writerRev int64
			for {
				i := next.Add(1)
				if i > int64(run.N) {
					return
				}
				var then []clientv3.Op
				for j := range sh.Keys {
					// Distinct keys of the Create's key sizes: the part
					// that tells them apart comes last and is never cut
					// off (a key shorter than it runs a few bytes longer).
					tail := fmt.Sprintf("/%d/%d/%d", w, i%1000, j)
					k := pad(sh.Keys[j]-len(tail), run.Prefix+"/state/") + tail
					if j == len(sh.Keys)-1 {
						k = writer
					}
					then = append(then, clientv3.OpPut(k, strings.Repeat("v", sh.Values[j])))
				}
				start := time.Now()
				resp, err := cl.Txn(ctx).
					If(clientv3.Compare(clientv3.CreateRevision(election), "=", run.GuardRev),
						clientv3.Compare(clientv3.ModRevision(writer), "=", writerRev)).
					Then(then...).
					Else(clientv3.OpGet(writer), clientv3.OpGet(election)).
					Commit()
				d := time.Since(start)
				if err == nil && !resp.Succeeded {
					err = errors.New("the guard failed")
				}
				mu.Lock()
				if err != nil {
					if first == nil {
						first = fmt.Errorf("bare txn: %w", err)
					}
					mu.Unlock()
					next.Store(int64(run.N)) // stop every client
					return
				}
				res.LatencyNs = append(res.LatencyNs, int64(d))
				mu.Unlock()
				writerRev = resp.Header.Revision
			}
		})
	}
	wg.Wait()
	res.ElapsedNs = int64(time.Since(t0))
	return res, first
}

// bareChildEnv, when set in the environment, makes the test binary a bare
// client (see bareChild) instead of running tests.
const bareChildEnv = "HA_BARE_CHILD"

// bareChildWait bounds a bare client's whole run.
const bareChildWait = 10 * time.Minute

// inChild runs the txns in a process of their own: this test binary,
// started again with the run in bareChildEnv, answers with its result as
// JSON on stdout. Its start and its client's connect are not timed.
func (run bareRun) inChild(ctx context.Context) (bareResult, error) {
	spec, err := json.Marshal(run)
	if err != nil {
		return bareResult{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, bareChildWait)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), bareChildEnv+"="+string(spec))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return bareResult{}, fmt.Errorf("bare client process: %w", err)
	}
	var res bareResult
	if err := json.Unmarshal(out, &res); err != nil {
		return bareResult{}, fmt.Errorf("bare client process answered %q: %w", out, err)
	}
	if len(res.LatencyNs) != run.N {
		return bareResult{}, fmt.Errorf("bare client process timed %d txns of %d", len(res.LatencyNs), run.N)
	}
	return res, nil
}

// bareChild is the test binary as a bare client: it reads the run from
// bareChildEnv, connects to its endpoints, sends the txns and prints the
// result. It returns the process's exit code.
func bareChild(spec string) int {
	var run bareRun
	if err := json.Unmarshal([]byte(spec), &run); err != nil {
		fmt.Fprintln(os.Stderr, "bare client:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), bareChildWait)
	defer cancel()
	cl, err := clientv3.New(clientv3.Config{Endpoints: run.Endpoints, DialTimeout: 10 * time.Second, Context: ctx})
	if err != nil {
		fmt.Fprintln(os.Stderr, "bare client:", err)
		return 1
	}
	defer cl.Close()
	// Connected before the clock starts, as the in-process client is.
	if _, err := cl.Get(ctx, run.Prefix+"/election"); err != nil {
		fmt.Fprintln(os.Stderr, "bare client:", err)
		return 1
	}
	res, err := run.txns(ctx, cl)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bare client:", err)
		return 1
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fmt.Fprintln(os.Stderr, "bare client:", err)
		return 1
	}
	return 0
}
