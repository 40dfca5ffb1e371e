package etcdstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/bigfleet-vm/provider/internal/etcdtest"
)

// inflightRounds is how many rounds BenchmarkTwoInFlight runs; each
// round is one block of each kind, so a busy second of the machine lands
// in all of them alike.
const inflightRounds = 20

// BenchmarkTwoInFlight asks whether a Create would be acknowledged sooner
// if its txn did not carry the reconciler's records of the Create before
// it (what the store's one txn in flight and Options.Linger make it do in
// a one-client stream) but went beside them, a second txn in flight on a
// writer chain of its own. Three kinds of one-client txns, guarded as the
// store guards its txns, with the value sizes a Create on the simulator
// writes (measured from a watch, docs/high-availability.md):
//
//   - own: a Create's own four puts alone (machine, meta, history, writer);
//   - riding: those and the records of the Create before in one txn (nine
//     puts), what the store sends today;
//   - riding-real: riding without the simulator's world records (six
//     puts), what a Create's txn carries on a real hypervisor;
//   - beside: the records (six puts) sent first, and 200 µs later the
//     Create's four puts on a second writer chain; only the Create's txn is
//     timed, until its own commit. That is the best two txns in flight
//     could give an acknowledgement: the store acknowledges in Commit
//     order, so it would also wait for the records' txn;
//   - merged: riding with the records' bytes in one put (five puts), the
//     most a store that packed a Create's records into one key could save;
//   - own-big: four puts carrying riding's bytes, so that with merged it
//     tells what the records cost in puts from what they cost in bytes.
//
// It reports each kind's p50 and p99, the ridings' p99 over own's, and
// beside's over riding's.
func BenchmarkTwoInFlight(b *testing.B) {
	c := etcdtest.Start(b, etcdtest.Options{})
	cl := newClient(b, c)
	ctx := context.Background()
	prefix := testPrefix("bench-inflight")
	election, err := cl.Put(ctx, prefix+"/election", "x")
	if err != nil {
		b.Fatal(err)
	}
	guard := clientv3.Compare(clientv3.CreateRevision(prefix+"/election"), "=", election.Header.Revision)
	// A chain is one writer key and the mod revision its last txn left.
	type chain struct {
		key string
		rev int64
	}
	seq := 0
	send := func(ch *chain, sizes []int) error {
		seq++
		then := make([]clientv3.Op, 0, len(sizes)+1)
		for i, n := range sizes {
			then = append(then, clientv3.OpPut(fmt.Sprintf("%s/state/k%d/%d", prefix, seq%1000, i), string(value(seq, n))))
		}
		then = append(then, clientv3.OpPut(ch.key, fmt.Sprint(seq)))
		resp, err := cl.Txn(ctx).If(guard, clientv3.Compare(clientv3.ModRevision(ch.key), "=", ch.rev)).
			Then(then...).Else(clientv3.OpGet(ch.key), clientv3.OpGet(prefix+"/election")).Commit()
		if err != nil {
			return err
		}
		if !resp.Succeeded {
			return fmt.Errorf("txn on %s refused", ch.key)
		}
		ch.rev = resp.Header.Revision
		return nil
	}
	own := []int{473, 93, 170} // + the writer key: 4 puts
	// The Create before's records: its machine and history, and the
	// simulator's world (seed ISO, overlay, domain), which a real
	// hypervisor does not write.
	records := []int{405, 1121, 203, 151, 478}
	riding := slices.Concat(own, records) // + the writer key: 9 puts
	ridingReal := slices.Concat(own, records[:2])
	// merged packs the records' bytes into one put; ownBig spreads them
	// over own's puts.
	recordBytes, ownBig := 0, slices.Clone(own)
	for i, n := range records {
		recordBytes += n
		ownBig[i%len(ownBig)] += n
	}
	merged := slices.Concat(own, []int{recordBytes})
	w0, w1 := &chain{key: prefix + "/writer"}, &chain{key: prefix + "/writer2"}

	alone := func(sizes []int) func() (time.Duration, error) {
		return func() (time.Duration, error) {
			start := time.Now()
			err := send(w0, sizes)
			return time.Since(start), err
		}
	}
	beside := func() (time.Duration, error) {
		done := make(chan error, 1)
		go func() { done <- send(w1, records) }()
		time.Sleep(200 * time.Microsecond)
		d, err := alone(own)()
		if berr := <-done; err == nil {
			err = berr
		}
		return d, err
	}
	type kind struct {
		name string
		run  func() (time.Duration, error)
		lat  []time.Duration
	}
	kOwn, kRiding, kReal, kBeside := &kind{name: "own", run: alone(own)}, &kind{name: "riding", run: alone(riding)},
		&kind{name: "riding-real", run: alone(ridingReal)}, &kind{name: "beside", run: beside}
	kMerged, kBig := &kind{name: "merged", run: alone(merged)}, &kind{name: "own-big", run: alone(ownBig)}
	kinds := []*kind{kOwn, kRiding, kReal, kBeside, kMerged, kBig}
	block := max(b.N/inflightRounds, 1)
	b.ResetTimer()
	for round := range inflightRounds {
		for k := range kinds {
			kd := kinds[(round+k)%len(kinds)]
			for range block {
				d, err := kd.run()
				if err != nil {
					b.Fatal(err)
				}
				kd.lat = append(kd.lat, d)
			}
		}
	}
	b.StopTimer()
	var line []string
	for _, k := range kinds {
		slices.Sort(k.lat)
		r := func(p float64) time.Duration { return pctOf(k.lat, p).Round(10 * time.Microsecond) }
		line = append(line, fmt.Sprintf("%s p50 %v p99 %v", k.name, r(0.5), r(0.99)))
		b.ReportMetric(ms(pctOf(k.lat, 0.5)), k.name+"-p50-ms")
		b.ReportMetric(ms(pctOf(k.lat, 0.99)), k.name+"-p99-ms")
	}
	ratio := func(x, y *kind, p float64) float64 { return float64(pctOf(x.lat, p)) / float64(pctOf(y.lat, p)) }
	b.ReportMetric(ratio(kRiding, kOwn, 0.99), "p99-riding/own")
	b.ReportMetric(ratio(kReal, kOwn, 0.99), "p99-riding-real/own")
	b.ReportMetric(ratio(kMerged, kOwn, 0.99), "p99-merged/own")
	b.ReportMetric(ratio(kBig, kOwn, 0.99), "p99-own-big/own")
	b.ReportMetric(ratio(kBeside, kRiding, 0.5), "p50-beside/riding")
	b.ReportMetric(ratio(kBeside, kRiding, 0.99), "p99-beside/riding")
	b.Logf("%d rounds of %d: %s", inflightRounds, block, strings.Join(line, "; "))
}
