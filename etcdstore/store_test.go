package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/internal/etcdtest"
	"github.com/google/go-cmp/cmp"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestCommitOrderAndGrouping commits batches from several goroutines
// without waiting and checks that every done runs exactly once, in Commit
// order, never concurrently, that etcd ends up with what applying the
// batches in order gives, and that txns stay within the limits. The
// cluster runs with the same limits as the store, so etcd itself rejects
// a txn that breaks them.
func TestCommitOrderAndGrouping(t *testing.T) {
	tests := []struct {
		name    string
		cluster etcdtest.Options
		opts    Options
		maxVal  int
	}{
		{name: "default-limits", maxVal: 2048},
		{
			name:    "small-limits",
			cluster: etcdtest.Options{MaxTxnOps: 8, MaxRequestBytes: 24 << 10},
			opts:    Options{MaxTxnOps: 8, MaxRequestBytes: 24 << 10},
			maxVal:  4096,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := sharedCluster(t)
			if tt.cluster != (etcdtest.Options{}) {
				c = etcdtest.Start(t, tt.cluster)
			}
			var txns, maxOps, maxBytes atomic.Int64
			tt.opts.OnCommit = func(ops, bytes int, _ time.Duration) {
				txns.Add(1)
				if int64(ops) > maxOps.Load() {
					maxOps.Store(int64(ops))
				}
				if int64(bytes) > maxBytes.Load() {
					maxBytes.Store(int64(bytes))
				}
			}
			prefix := testPrefix("order")
			cl, _, s := leader(t, c, prefix, tt.opts)

			const writers, perWriter = 8, 150
			var (
				mu      sync.Mutex // makes Commit order = seq order = model order
				seq     int
				md      model
				inDone  atomic.Bool
				got     []int
				errs    []error
				all     sync.WaitGroup
				overlap atomic.Bool
			)
			all.Add(writers * perWriter)
			var wg sync.WaitGroup
			for w := range writers {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(w), 1))
					for range perWriter {
						ops := make([]Op, 1+rng.IntN(5))
						for i := range ops {
							key := fmt.Sprintf("k%02d", rng.IntN(40))
							if rng.IntN(4) == 0 {
								ops[i] = Op{Key: key, Delete: true}
							} else {
								ops[i] = Op{Key: key, Value: value(rng.IntN(1000), 1+rng.IntN(tt.maxVal))}
							}
						}
						mu.Lock()
						seq++
						n := seq
						md.apply(ops)
						s.Commit(ops, func(err error) {
							if !inDone.CompareAndSwap(false, true) {
								overlap.Store(true)
							}
							got = append(got, n)
							if err != nil {
								errs = append(errs, err)
							}
							inDone.Store(false)
							all.Done()
						})
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			all.Wait()
			if overlap.Load() {
				t.Error("done callbacks ran concurrently")
			}
			if len(errs) > 0 {
				t.Fatalf("%d batches failed, first: %v", len(errs), errs[0])
			}
			want := make([]int, writers*perWriter)
			for i := range want {
				want[i] = i + 1
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("done order (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(md.snapshot(), dump(t, cl, prefix)); diff != "" {
				t.Errorf("etcd content (-want +got):\n%s", diff)
			}
			if got, want := s.Size(), md.bytes(); got != want {
				t.Errorf("Size() = %d, want %d", got, want)
			}
			if err := s.Healthy(); err != nil {
				t.Errorf("Healthy() = %v", err)
			}
			if n := txns.Load(); n >= writers*perWriter {
				t.Errorf("%d txns for %d batches: nothing was grouped", n, writers*perWriter)
			}
			if limit := int64(s.maxOps); maxOps.Load() > limit {
				t.Errorf("a txn carried %d ops, more than %d", maxOps.Load(), limit)
			}
			if limit := int64(s.maxBytes); maxBytes.Load() > limit {
				t.Errorf("a txn carried %d bytes, more than %d", maxBytes.Load(), limit)
			}
			t.Logf("%d batches in %d txns; largest txn %d ops, %d bytes", writers*perWriter, txns.Load(), maxOps.Load(), maxBytes.Load())
		})
	}
}

// TestSameKeyTwice checks batches that touch one key more than once,
// alone and merged with their neighbours into one txn (etcd refuses a txn
// that names a key twice).
func TestSameKeyTwice(t *testing.T) {
	c := sharedCluster(t)
	put := func(k, v string) Op { return Op{Key: k, Value: []byte(v)} }
	del := func(k string) Op { return Op{Key: k, Delete: true} }
	tests := []struct {
		name    string
		batches [][]Op
		want    map[string]string
	}{
		{name: "put-put", batches: [][]Op{{put("a", "1"), put("a", "2")}}, want: map[string]string{"a": "2"}},
		{name: "put-delete", batches: [][]Op{{put("a", "1"), put("b", "1"), del("a")}}, want: map[string]string{"b": "1"}},
		{name: "delete-put", batches: [][]Op{{del("a"), put("a", "3")}}, want: map[string]string{"a": "3"}},
		{name: "across-batches", batches: [][]Op{{put("a", "1")}, {del("a"), put("b", "2")}, {put("a", "4")}, {del("b")}}, want: map[string]string{"a": "4"}},
		{name: "delete-missing", batches: [][]Op{{del("nothing")}, {put("x", "y")}}, want: map[string]string{"x": "y"}},
		{name: "empty-batch", batches: [][]Op{{}, {put("x", "y")}, {}}, want: map[string]string{"x": "y"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := testPrefix("same-" + tt.name)
			cl, _, s := leader(t, c, prefix, Options{})
			done := make(chan error, len(tt.batches))
			for _, b := range tt.batches {
				s.Commit(b, func(err error) { done <- err })
			}
			for range tt.batches {
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
			if diff := cmp.Diff(tt.want, dump(t, cl, prefix)); diff != "" {
				t.Errorf("etcd content (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLargeFirstWrite writes 100,000 values of 600 bytes as one batch
// (split across txns written in parallel) and loads them back through a
// new store. Under the race detector the three members in this process
// apply a put about ten times slower (100,000 take 1.5 min here), so
// there it writes 10,000, which still spans 79 txns; BenchmarkFirstWrite
// and BenchmarkLoad always use 100,000.
func TestLargeFirstWrite(t *testing.T) {
	c := sharedCluster(t)
	var txns atomic.Int64
	prefix := testPrefix("big")
	cl, term, s := leader(t, c, prefix, Options{OnCommit: func(int, int, time.Duration) { txns.Add(1) }})
	n := 100_000
	if raceEnabled {
		n = 10_000
	}
	ops := make([]Op, n)
	want := make(map[string][]byte, n)
	for i := range ops {
		ops[i] = Op{Key: fmt.Sprintf("m/%06d", i), Value: value(i, 600)}
		want[ops[i].Key] = ops[i].Value
	}
	start := time.Now()
	if err := commitWithin(t, s, 10*wait, ops...); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %d keys in %d txns in %v", n, txns.Load(), time.Since(start))
	if min := int64(n / (DefaultMaxTxnOps - 1)); txns.Load() < min {
		t.Errorf("%d txns; %d ops cannot fit in fewer than %d", txns.Load(), n, min)
	}

	s2 := openStore(t, cl, prefix, term, Options{})
	start = time.Now()
	got, err := s2.Load(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("loaded %d keys in %v", len(got), time.Since(start))
	if len(got) != n {
		t.Fatalf("loaded %d keys, want %d", len(got), n)
	}
	for k, v := range want {
		if string(got[k]) != string(v) {
			t.Fatalf("key %s: loaded %d bytes that differ from the %d written", k, len(got[k]), len(v))
		}
	}
	if s2.Size() != s.Size() {
		t.Errorf("Size after Load = %d, Size of the writer = %d", s2.Size(), s.Size())
	}
}

// TestOversizedBatchAmongOthers commits, without waiting in between, a
// small batch, one too large for a txn (split into chunks written in
// parallel) and more small ones touching the same keys, on a cluster with
// small limits: etcd must end up with what applying them in order gives.
func TestOversizedBatchAmongOthers(t *testing.T) {
	limits := etcdtest.Options{MaxTxnOps: 8, MaxRequestBytes: 24 << 10}
	c := etcdtest.Start(t, limits)
	var txns atomic.Int64
	prefix := testPrefix("oversized")
	cl, _, s := leader(t, c, prefix, Options{
		MaxTxnOps: 8, MaxRequestBytes: 24 << 10, ChunkParallel: 4,
		OnCommit: func(int, int, time.Duration) { txns.Add(1) },
	})
	var big []Op
	for i := range 200 {
		big = append(big, Op{Key: fmt.Sprintf("k%03d", i%150), Value: value(i, 1+i*37%3000)})
		if i%9 == 0 {
			big = append(big, Op{Key: fmt.Sprintf("k%03d", (i+1)%150), Delete: true})
		}
	}
	batches := [][]Op{
		{{Key: "k000", Value: []byte("first")}, {Key: "k149", Value: []byte("first")}, {Key: "other", Value: []byte("1")}},
		big,
		{{Key: "k001", Value: []byte("after")}, {Key: "k002", Delete: true}},
		{{Key: "other", Delete: true}, {Key: "k100", Value: []byte("last")}},
	}
	var md model
	results := make(chan error, len(batches))
	for _, b := range batches {
		md.apply(b)
		s.Commit(b, func(err error) { results <- err })
	}
	for range batches {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(md.snapshot(), dump(t, cl, prefix)); diff != "" {
		t.Errorf("etcd content (-want +got):\n%s", diff)
	}
	if got, want := s.Size(), md.bytes(); got != want {
		t.Errorf("Size() = %d, want %d", got, want)
	}
	t.Logf("%d batches in %d txns", len(batches), txns.Load())
}

// TestBadBatchStopsStore checks that a batch etcd cannot take fails with
// a clear error and stops the store: the batch before it is committed,
// nothing of it or after it is.
func TestBadBatchStopsStore(t *testing.T) {
	c := sharedCluster(t)
	tests := []struct {
		name string
		bad  Op
		err  string
	}{
		{name: "empty-key", bad: Op{Value: []byte("x")}, err: "empty key"},
		{name: "long-key", bad: Op{Key: strings.Repeat("k", MaxKeyBytes+1)}, err: "more than the 4096 allowed"},
		{name: "huge-value", bad: Op{Key: "huge", Value: make([]byte, DefaultMaxRequestBytes)}, err: "--max-request-bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := testPrefix("bad-" + tt.name)
			cl, term, s := leader(t, c, prefix, Options{})
			results := make(chan error, 3)
			s.Commit([]Op{{Key: "before", Value: []byte("1")}}, func(err error) { results <- err })
			s.Commit([]Op{{Key: "with-bad", Value: []byte("1")}, tt.bad}, func(err error) { results <- err })
			s.Commit([]Op{{Key: "after", Value: []byte("1")}}, func(err error) { results <- err })
			if err := <-results; err != nil {
				t.Errorf("batch before the bad one: %v", err)
			}
			err := <-results
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("bad batch: error %v, want one containing %q", err, tt.err)
			}
			if err := <-results; err == nil {
				t.Error("batch after the bad one succeeded")
			}
			if err := s.Healthy(); err == nil {
				t.Error("Healthy() = nil after a failed batch")
			}
			select {
			case <-term.Done():
			case <-time.After(wait):
				t.Error("the term did not end when the store failed")
			}
			if diff := cmp.Diff(map[string]string{"before": "1"}, dump(t, cl, prefix)); diff != "" {
				t.Errorf("etcd content (-want +got):\n%s", diff)
			}
		})
	}
}

// TestClose checks that Close commits what was queued and that later
// batches fail with ErrClosed, in order.
func TestClose(t *testing.T) {
	c := sharedCluster(t)
	prefix := testPrefix("close")
	cl, _, s := leader(t, c, prefix, Options{})
	var mu sync.Mutex
	var got []string
	rec := func(name string) func(error) {
		return func(err error) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, fmt.Sprintf("%s:%v", name, err))
		}
	}
	for i := range 20 {
		s.Commit([]Op{{Key: fmt.Sprint(i), Value: []byte("v")}}, rec(fmt.Sprint(i)))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s.Commit([]Op{{Key: "late1", Value: []byte("v")}}, rec("late1"))
	s.Commit([]Op{{Key: "late2", Value: []byte("v")}}, rec("late2"))
	var want []string
	for i := range 20 {
		want = append(want, fmt.Sprintf("%d:<nil>", i))
	}
	want = append(want, "late1:"+ErrClosed.Error(), "late2:"+ErrClosed.Error())
	deadline := time.Now().Add(wait)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n == len(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
	if n := len(dump(t, cl, prefix)); n != 20 {
		t.Errorf("etcd holds %d keys, want 20", n)
	}
}

// TestCommitDuringClose commits from a goroutine while Close runs: every
// done runs once, in order, never two at a time; the committed batches are
// a prefix of the calls, all in etcd, and the rest fail with ErrClosed.
func TestCommitDuringClose(t *testing.T) {
	c := sharedCluster(t)
	prefix := testPrefix("close-race")
	cl, _, s := leader(t, c, prefix, Options{})
	const n = 400
	var (
		mu      sync.Mutex
		got     []string
		inDone  atomic.Bool
		overlap atomic.Bool
		all     sync.WaitGroup
	)
	all.Add(n)
	go func() {
		for i := range n {
			s.Commit([]Op{{Key: fmt.Sprintf("%03d", i), Value: []byte("v")}}, func(err error) {
				if !inDone.CompareAndSwap(false, true) {
					overlap.Store(true)
				}
				mu.Lock()
				got = append(got, fmt.Sprintf("%03d:%v", i, err))
				mu.Unlock()
				inDone.Store(false)
				all.Done()
			})
			if i%50 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
	}()
	time.Sleep(5 * time.Millisecond)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	all.Wait()
	if overlap.Load() {
		t.Error("done callbacks overlapped")
	}
	stored := dump(t, cl, prefix)
	closed := false
	for i, g := range got {
		key, res, _ := strings.Cut(g, ":")
		if key != fmt.Sprintf("%03d", i) {
			t.Fatalf("done #%d was for batch %s", i, key)
		}
		switch res {
		case "<nil>":
			if closed {
				t.Errorf("batch %s committed after an earlier one failed with ErrClosed", key)
			}
			if _, ok := stored[key]; !ok {
				t.Errorf("batch %s acknowledged but not in etcd", key)
			}
		case ErrClosed.Error():
			closed = true
			if _, ok := stored[key]; ok {
				t.Errorf("batch %s failed with ErrClosed but is in etcd", key)
			}
		default:
			t.Errorf("batch %s: %s", key, res)
		}
	}
	t.Logf("%d of %d batches committed before Close", len(stored), n)
}

// TestRetryFindsItsOwnWrite replays the situation of a txn whose first
// attempt applied although the client saw an error: the next attempt's
// writer compare fails, and the store must report success from the writer
// key instead of applying twice or failing.
func TestRetryFindsItsOwnWrite(t *testing.T) {
	c := sharedCluster(t)
	prefix := testPrefix("retry")
	cl, _, s := leader(t, c, prefix, Options{})
	if err := commit(t, s, Op{Key: "a", Value: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	before := s.writerRev
	if err := commit(t, s, Op{Key: "b", Value: []byte("2")}); err != nil {
		t.Fatal(err)
	}
	applied := s.writerRev
	// Rewind the committer to before the second txn, as if its reply had
	// been lost, and send the same txn again.
	s.writerRev, s.seq = before, s.seq-1
	if err := commit(t, s, Op{Key: "b", Value: []byte("2")}); err != nil {
		t.Fatalf("retry of an applied txn: %v", err)
	}
	if s.writerRev != applied {
		t.Errorf("writer revision after the retry = %d, want the first attempt's %d", s.writerRev, applied)
	}
	resp, err := cl.Get(ctxFor(t), prefix+"/state/b")
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Kvs[0].ModRevision; got != applied {
		t.Errorf("key b was rewritten at revision %d; the first attempt wrote it at %d", got, applied)
	}
	// A stale attempt (compare against the revision before) cannot apply
	// once a later txn moved the writer key.
	if err := commit(t, s, Op{Key: "c", Value: []byte("3")}); err != nil {
		t.Fatal(err)
	}
	stale, err := cl.Txn(ctxFor(t)).
		If(clientv3.Compare(clientv3.ModRevision(s.writerKey), "=", before)).
		Then(clientv3.OpPut(prefix+"/state/b", "stale")).Commit()
	if err != nil {
		t.Fatal(err)
	}
	if stale.Succeeded {
		t.Error("a replayed txn with an old writer revision applied")
	}
}

// TestOpenAndLoadNeedTheTerm checks that a store cannot be opened or
// loaded for a term that has ended.
func TestOpenAndLoadNeedTheTerm(t *testing.T) {
	c := sharedCluster(t)
	cl := newClient(t, c)
	prefix := testPrefix("term")
	term := lead(t, newElector(t, cl, prefix, "a", 0))
	s := openStore(t, cl, prefix, term, Options{})
	if err := term.Resign(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(ctxFor(t)); !errors.Is(err, ErrNotLeader) {
		t.Errorf("Load after Resign: %v, want ErrNotLeader", err)
	}
	if err := commit(t, s, Op{Key: "a", Value: []byte("1")}); !errors.Is(err, ErrNotLeader) {
		t.Errorf("Commit after Resign: %v, want ErrNotLeader", err)
	}
	if _, err := Open(ctxFor(t), cl, prefix, term, Options{}); !errors.Is(err, ErrNotLeader) {
		t.Errorf("Open after Resign: %v, want ErrNotLeader", err)
	}
}

// TestMemberDownUnderLoad takes one etcd member of three away while
// batches keep coming: every batch still succeeds (Unavailable errors and
// etcd leader changes are retried) and the term survives.
func TestMemberDownUnderLoad(t *testing.T) {
	tests := []struct {
		name string
		down func(t *testing.T, c *etcdtest.Cluster) int
	}{
		{name: "leader-crashes", down: func(t *testing.T, c *etcdtest.Cluster) int { l := c.Leader(); c.Kill(t, l); return l }},
		{name: "follower-stops", down: func(t *testing.T, c *etcdtest.Cluster) int { f := (c.Leader() + 1) % 3; c.Stop(t, f); return f }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := etcdtest.Start(t, etcdtest.Options{})
			prefix := testPrefix("load")
			cl, term, s := leader(t, c, prefix, Options{})
			var (
				md       model
				mu       sync.Mutex
				n        atomic.Int64
				failed   atomic.Int64
				firstErr atomic.Value
				wg       sync.WaitGroup
			)
			stop := make(chan struct{})
			for w := range 4 {
				wg.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						ops := []Op{{Key: fmt.Sprintf("w%d/%d", w, i%50), Value: value(i, 200)}}
						ch := make(chan error, 1)
						mu.Lock()
						md.apply(ops)
						s.Commit(ops, func(err error) { ch <- err })
						mu.Unlock()
						if err := <-ch; err != nil {
							failed.Add(1)
							firstErr.CompareAndSwap(nil, err)
							return
						}
						n.Add(1)
					}
				})
			}
			time.Sleep(time.Second)
			before := n.Load()
			victim := tt.down(t, c)
			downAt := time.Now()
			c.WaitLeader(t)
			time.Sleep(2 * time.Second)
			close(stop)
			wg.Wait()
			if failed.Load() > 0 {
				t.Fatalf("%d writers failed after member %d went down: %v", failed.Load(), victim, firstErr.Load())
			}
			t.Logf("%d batches before member %d went down, %d in the %v after", before, victim, n.Load()-before, time.Since(downAt).Round(time.Millisecond))
			if n.Load() == before {
				t.Error("no batch committed after the member went down")
			}
			if err := s.Healthy(); err != nil {
				t.Errorf("Healthy() = %v", err)
			}
			if err := term.Err(); err != nil {
				t.Errorf("term ended: %v", err)
			}
			if diff := cmp.Diff(md.snapshot(), dump(t, cl, prefix)); diff != "" {
				t.Errorf("etcd content (-want +got):\n%s", diff)
			}
		})
	}
}

// TestQuorumLost stops two of three members: the next batch fails within
// a bounded time instead of hanging, and the store stays failed. With the
// default TTL the term's lease clock ends it first; with a long TTL the
// txn timeout does.
func TestQuorumLost(t *testing.T) {
	tests := []struct {
		name       string
		ttl        time.Duration
		txnTimeout time.Duration
		want       string
	}{
		{name: "term-ends", ttl: DefaultTTL, txnTimeout: 30 * time.Second, want: ErrNotLeader.Error()},
		{name: "txn-timeout", ttl: time.Minute, txnTimeout: 3 * time.Second, want: "deadline exceeded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := etcdtest.Start(t, etcdtest.Options{})
			cl := newClient(t, c)
			prefix := testPrefix("quorum")
			term := lead(t, newElector(t, cl, prefix, "a", tt.ttl))
			s := openStore(t, cl, prefix, term, Options{TxnTimeout: tt.txnTimeout})
			if err := commit(t, s, Op{Key: "a", Value: []byte("1")}); err != nil {
				t.Fatal(err)
			}
			lead := c.Leader()
			c.Kill(t, lead)
			c.Kill(t, (lead+1)%3)
			start := time.Now()
			err := commit(t, s, Op{Key: "b", Value: []byte("2")})
			took := time.Since(start)
			if err == nil {
				t.Fatal("commit without quorum succeeded")
			}
			t.Logf("commit without quorum failed after %v: %v", took.Round(time.Millisecond), err)
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not mention %q", err, tt.want)
			}
			if err := commit(t, s, Op{Key: "c", Value: []byte("3")}); err == nil {
				t.Error("commit after a failed one succeeded")
			}
			if s.Healthy() == nil {
				t.Error("Healthy() = nil without quorum")
			}
			c.RestartAll(t)
		})
	}
}

func TestRetryable(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{rpctypes.ErrNoLeader, true},
		{rpctypes.ErrLeaderChanged, true},
		{rpctypes.ErrTimeout, true},
		{rpctypes.ErrGRPCNoLeader, true},
		{status.Error(codes.Unavailable, "transport is closing"), true},
		{status.Error(codes.Unknown, "raft: stopped"), true},
		{fmt.Errorf("wrapped: %w", rpctypes.ErrLeaderChanged), true},
		{rpctypes.ErrTooManyOps, false},
		{rpctypes.ErrRequestTooLarge, false},
		{rpctypes.ErrNoSpace, false},
		{rpctypes.ErrPermissionDenied, false},
		{rpctypes.ErrGRPCDuplicateKey, false},
		{context.DeadlineExceeded, false},
		{errors.New("plain"), false},
	}
	for _, tt := range tests {
		if got := retryable(tt.err); got != tt.want {
			t.Errorf("retryable(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// TestSizeAfterLoad counts a loaded document's size right as its keys
// are overwritten, deleted, written again and joined by new ones (a key's
// size comes from the loaded value until it is committed again).
func TestSizeAfterLoad(t *testing.T) {
	c := sharedCluster(t)
	prefix := testPrefix("size-load")
	cl, term, s := leader(t, c, prefix, Options{})
	var md model
	first := []Op{{Key: "a", Value: value(1, 10)}, {Key: "b", Value: value(2, 20)}, {Key: "c", Value: value(3, 30)}}
	md.apply(first)
	if err := commitWithin(t, s, wait, first...); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s2 := openStore(t, cl, prefix, term, Options{})
	if _, err := s2.Load(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	for i, b := range [][]Op{
		{{Key: "a", Value: value(4, 5)}},                                  // a loaded key, smaller
		{{Key: "b", Delete: true}},                                        // a loaded key, gone
		{{Key: "b", Value: value(5, 40)}, {Key: "d", Value: value(6, 7)}}, // back, and a new one
		{{Key: "d", Delete: true}, {Key: "c", Delete: true}},              // the new one and a loaded one gone
		{{Key: "c", Delete: true}},                                        // gone twice
	} {
		md.apply(b)
		if err := commitWithin(t, s2, wait, b...); err != nil {
			t.Fatal(err)
		}
		if got, want := s2.Size(), md.bytes(); got != want {
			t.Errorf("after batch %d: Size() = %d, want %d", i, got, want)
		}
	}
}
