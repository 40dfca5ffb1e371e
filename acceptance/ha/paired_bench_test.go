//go:build ha

package ha

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
)

// pairedRounds is how many rounds BenchmarkHACreateVsBare runs: each
// round is one block of Creates and one block of each bare shape.
const pairedRounds = 20

// BenchmarkHACreateVsBare sets one client's Create ack beside etcd's own
// cost of the same writes, in one window of time: BenchmarkHACreateAck and
// BenchmarkHABareTxn run one after the other, so a busy second of the
// machine lands in one of them and not in the other, and their p99s move
// apart by more than the provider's share (on 2 cores, the same bare txn
// measured 2.5 and 4.8 ms at p99 in two sub-benchmarks of one run).
//
// It runs pairedRounds rounds. Each round is a block of
// b.N/pairedRounds Creates acknowledged by the leader, from one client in
// this process, and a block as long of one client's bare guarded txns for
// each of BenchmarkHABareTxn's shapes (alone, steady) and places (in this
// process, which hosts the members, and apart, a process of its own as
// the provider is). Blocks rather than alternate ops: a bare txn sent just
// after each Create would end the hold on the reconciler's records of it
// (etcdstore's Linger) and change what the Creates' txns carry. The block
// a round starts with rotates from round to round. It reports the
// Creates' p50 and p99 over all rounds, and the ratio of that p99 to each
// bare kind's p99 over all rounds.
func BenchmarkHACreateVsBare(b *testing.B) {
	s := benchReplicas(b)
	leader := s.waitLeader(b)
	c := s.client(leader)
	block := max(b.N/pairedRounds, 1)
	targets := take(b, block*pairedRounds)
	alone, steady := benchShape(b, s, false), benchShape(b, s, true)
	cl := s.cluster.Client(b)
	ctx := context.Background()
	base := fmt.Sprintf("/ha/paired-%d", time.Now().UnixNano())

	var creates []time.Duration
	runCreates := func(ids []string) {
		for _, id := range ids {
			creates = timed(b, creates, func(ctx context.Context) error {
				_, err := c.Create(ctx, &pb.CreateRequest{MachineId: id})
				return err
			})
		}
	}
	type bareKind struct {
		name  string
		shape createShape
		apart bool
		lat   []time.Duration
	}
	bares := []*bareKind{{name: "alone-members", shape: alone}, {name: "steady-members", shape: steady},
		{name: "alone-apart", shape: alone, apart: true}, {name: "steady-apart", shape: steady, apart: true}}
	// runBare sends one block of bare txns of k under a prefix of its
	// own: a writer chain starts at revision 0, so every block needs its
	// own writer key. Its election key is put, and a client apart is
	// started and connected, outside the clock (bareRun.inChild).
	runBare := func(round int, k *bareKind) {
		run := bareRun{Endpoints: s.cluster.Endpoints(), Prefix: fmt.Sprintf("%s/%s-%d", base, k.name, round),
			Shape: k.shape, Clients: 1, N: block}
		put, err := cl.Put(ctx, run.Prefix+"/election", "x")
		if err != nil {
			b.Fatal(err)
		}
		run.GuardRev = put.Header.Revision
		var res bareResult
		if k.apart {
			res, err = run.inChild(ctx)
		} else {
			res, err = run.txns(ctx, cl)
		}
		if err != nil {
			b.Fatal(err)
		}
		k.lat = append(k.lat, res.latencies()...)
	}
	kinds := []func(round int){func(round int) { runCreates(targets[round*block : (round+1)*block]) }}
	for _, k := range bares {
		kinds = append(kinds, func(round int) { runBare(round, k) })
	}
	b.ResetTimer()
	for round := range pairedRounds {
		for k := range kinds {
			kinds[(round+k)%len(kinds)](round)
		}
	}
	b.StopTimer()
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	p99 := pct(creates, 0.99)
	b.ReportMetric(ms(pct(creates, 0.50)), "ms-p50")
	b.ReportMetric(ms(p99), "ms-p99")
	line := fmt.Sprintf("paired, %d rounds of %d: Create p50 %v p99 %v", pairedRounds, block, r(pct(creates, 0.5)), r(p99))
	for _, k := range bares {
		kp99 := pct(k.lat, 0.99)
		b.ReportMetric(float64(p99)/float64(kp99), "p99/bare-"+k.name)
		line += fmt.Sprintf("; bare %s p50 %v p99 %v (%.2fx)", k.name, r(pct(k.lat, 0.5)), r(kp99), float64(p99)/float64(kp99))
	}
	fmt.Fprintln(os.Stderr, line)
}
