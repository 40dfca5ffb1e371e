//go:build ha

package ha

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/etcdtest"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// takeoverSizes are the fleets BenchmarkHATakeoverScale fails over.
var takeoverSizes = []int{1000, 10000, 100000}

// warmLine is what a standby logs once its copy of the document is
// loaded (the watch keeps it current from then on).
const warmLine = `msg="following the etcd state"`

// takeoverPoll is how often the benchmark asks the standby for the
// mutation while it is not leading yet; it bounds the measurement error
// of the provider's part.
const takeoverPoll = 2 * time.Millisecond

// BenchmarkHATakeoverScale kills the leader (-9) of two replicas of a
// 1,000-, 10,000- and 100,000-machine fleet b.N times each and measures
// the time to the first Create the standby acknowledges, split in two:
// the lease's part (kill -9 until etcd deletes the dead leader's election
// key, when its lease runs out: what --leader-lease decides) and the
// provider's own part (from that deletion until the acknowledged Create:
// the standby noticing it won, opening its term from its warm copy and
// committing the Create). The killed replica comes back as the standby,
// and the next kill waits until its copy is loaded.
func BenchmarkHATakeoverScale(b *testing.B) {
	for _, n := range takeoverSizes {
		b.Run("machines="+strconv.Itoa(n), func(b *testing.B) { benchTakeover(b, n) })
	}
}

func benchTakeover(b *testing.B, machines int) {
	c, err := etcdtest.New(etcdtest.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	prefix := fmt.Sprintf("/ha/takeover-%d", machines)
	s := &replicaSet{t: b, cluster: c, prefix: prefix}
	for range 2 {
		s.reps = append(s.reps, providertest.Start(b, binary, providertest.Options{
			Args: []string{"serve", "--use-fake-backend", "--state", c.URL(prefix), "--log-level", "info",
				"--seed-count", strconv.Itoa(machines)},
			WaitPath: "/healthz", ReadyTimeout: benchStartWait,
			Dial: []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1 << 30))},
		}))
	}
	leader := -1
	for deadline := time.Now().Add(benchStartWait); leader < 0; time.Sleep(100 * time.Millisecond) {
		if sv := s.serving(); len(sv) == 1 {
			leader = sv[0]
		}
		if time.Now().After(deadline) {
			b.Fatalf("no replica of %d machines leads after %v", machines, benchStartWait)
		}
	}
	waitWarm(b, s.reps[1-leader])
	targets := ids(s.list(b, providertest.StSpeculative))
	if len(targets) < b.N {
		b.Fatalf("%d SPECULATIVE machines for %d kills", len(targets), b.N)
	}
	cl := c.Client(b)
	var lease, own, inProc, total []time.Duration
	warm := 0 // takeovers that started from the warm copy
	b.ResetTimer()
	for i := range b.N {
		old := s.waitLeader(b)
		next := 1 - old
		deleted := watchElectionDelete(b, cl, prefix)
		t0 := time.Now()
		s.reps[old].Kill()
		acked := createOn(b, s.reps[next].Client(), targets[i])
		del := <-deleted
		b.StopTimer()
		if del.IsZero() {
			b.Fatal("the test never saw the killed leader's election key deleted")
		}
		lease = append(lease, del.Sub(t0))
		own = append(own, acked.Sub(del))
		total = append(total, acked.Sub(t0))
		inProc = append(inProc, loadTime(b, s.reps[next].Output()))
		fmt.Fprintf(os.Stderr, "takeover %d of %d machines: %s\n", i+1, machines, takeoverParts(s.reps[next].Output()))
		if strings.Contains(s.reps[next].Output(), warmTaken) {
			warm++
		}
		s.reps[old].Launch()
		waitWarm(b, s.reps[old])
		b.StartTimer()
	}
	b.StopTimer()
	for name, d := range map[string][]time.Duration{"lease": lease, "own": own, "total": total, "elected-to-serving": inProc} {
		b.ReportMetric(float64(pct(d, 0.5).Microseconds())/1000, "ms-"+name+"-p50")
		b.ReportMetric(float64(pct(d, 1).Microseconds())/1000, "ms-"+name+"-max")
	}
	fmt.Fprintf(os.Stderr, "takeover of %d machines (%d of %d from the warm copy): kill -9 -> acknowledged Create %s; lease (kill -> election key deleted) %s; provider's own part (deleted -> acknowledged) %s; of which elected -> serving (standby's log) %s\n",
		machines, warm, b.N, dist(total), dist(lease), dist(own), dist(inProc))
}

// partsRE finds the parts of a new leader's opening of its term.
var partsRE = regexp.MustCompile(`msg="leading: serving the desired state" .* parts="([^"]*)"`)

// takeoverParts is what the newest term in out spent, part by part.
func takeoverParts(out string) string {
	m := partsRE.FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		return "(no parts logged)"
	}
	return m[len(m)-1][1]
}

// waitWarm waits until replica p's current process has loaded its copy.
func waitWarm(b *testing.B, p *providertest.Provider) {
	b.Helper()
	for deadline := time.Now().Add(benchStartWait); !strings.Contains(p.Output(), warmLine); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("the standby has no copy of the state after %v:\n%s", benchStartWait, tailLines(p.Output(), 30))
		}
	}
}

// watchElectionDelete returns a channel that yields when the test saw
// the current leader's election key deleted.
func watchElectionDelete(b *testing.B, cl *clientv3.Client, prefix string) <-chan time.Time {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), takeoverWait)
	resp, err := cl.Get(ctx, prefix+"/election/", clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 {
		cancel()
		b.Fatalf("read the election: %v (%d keys)", err, len(resp.Kvs))
	}
	key := string(resp.Kvs[0].Key)
	wch := cl.Watch(ctx, key, clientv3.WithRev(resp.Header.Revision+1))
	out := make(chan time.Time, 1)
	go func() {
		defer cancel()
		for wr := range wch {
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					out <- time.Now()
					return
				}
			}
		}
		close(out)
	}()
	return out
}

// createOn asks c for Create until it is acknowledged (a standby answers
// UNAVAILABLE at once) and returns when.
func createOn(b *testing.B, c pb.CapacityProviderClient, id string) time.Time {
	b.Helper()
	deadline := time.Now().Add(takeoverWait)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
		_, err := c.Create(ctx, &pb.CreateRequest{MachineId: id})
		cancel()
		if err == nil {
			return time.Now()
		}
		if !outcomeUnknown(err) || time.Now().After(deadline) {
			b.Fatalf("Create %s on the standby: %v", id, err)
		}
		time.Sleep(takeoverPoll)
	}
}
