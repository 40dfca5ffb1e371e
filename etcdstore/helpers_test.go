package etcdstore

import (
	"context"
	"fmt"
	"maps"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/internal/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var (
	sharedOnce sync.Once
	shared     *etcdtest.Cluster
	sharedErr  error
)

// sharedCluster is a three-member cluster for the tests that leave its
// members alone; each uses its own key prefix. TestMain closes it.
func sharedCluster(t testing.TB) *etcdtest.Cluster {
	t.Helper()
	sharedOnce.Do(func() { shared, sharedErr = etcdtest.New(etcdtest.Options{}) })
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil {
		shared.Close()
	}
	os.Exit(code)
}

var prefixes atomic.Int64

// testPrefix is a key prefix no other test (nor another -count run) uses
// on the shared cluster.
func testPrefix(name string) string {
	return fmt.Sprintf("/%s-%d", name, prefixes.Add(1))
}

// testTTL is the election TTL of tests that wait for a lease to expire:
// etcd's minimum with default timing.
const testTTL = 2 * time.Second

// wait bounds how long a test waits for something that must happen; it
// only turns a hang into a failure and is no performance assertion.
const wait = 30 * time.Second

func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
	t.Cleanup(cancel)
	return ctx
}

// newClient connects a client of the cluster the way the provider does.
func newClient(t testing.TB, c *etcdtest.Cluster) *clientv3.Client {
	t.Helper()
	cfg := ClientConfig{Endpoints: c.Endpoints()}
	if c.Certs != nil {
		cfg.CAFile, cfg.CertFile, cfg.KeyFile = c.Certs.CA, c.Certs.ClientCert, c.Certs.ClientKey
	}
	cl, err := NewClient(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

func newElector(t testing.TB, cl *clientv3.Client, prefix, identity string, ttl time.Duration) *Elector {
	t.Helper()
	e, err := NewElector(cl, prefix, identity, ElectionOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// lead campaigns (expecting to win at once) and resigns at cleanup.
func lead(t testing.TB, e *Elector) *Term {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	term, err := e.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		term.Resign(ctx)
	})
	return term
}

func openStore(t testing.TB, cl *clientv3.Client, prefix string, term *Term, opts Options) *Store {
	t.Helper()
	s, err := Open(ctxFor(t), cl, prefix, term, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// leader starts a one-replica leader with an open store on prefix.
func leader(t testing.TB, c *etcdtest.Cluster, prefix string, opts Options) (*clientv3.Client, *Term, *Store) {
	t.Helper()
	cl := newClient(t, c)
	term := lead(t, newElector(t, newClient(t, c), prefix, "replica-a", 0))
	s := openStore(t, cl, prefix, term, opts)
	if _, err := s.Load(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	return cl, term, s
}

// commit commits ops and waits for the outcome.
func commit(t testing.TB, s *Store, ops ...Op) error {
	t.Helper()
	return commitWithin(t, s, wait, ops...)
}

func commitWithin(t testing.TB, s *Store, d time.Duration, ops ...Op) error {
	t.Helper()
	ch := make(chan error, 1)
	s.Commit(ops, func(err error) { ch <- err })
	select {
	case err := <-ch:
		return err
	case <-time.After(d):
		t.Fatalf("commit of %d ops did not finish within %v", len(ops), d)
		return nil
	}
}

// dump reads every key under prefix/state/ straight from etcd.
func dump(t testing.TB, cl *clientv3.Client, prefix string) map[string]string {
	t.Helper()
	resp, err := cl.Get(ctxFor(t), prefix+"/state/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	m := make(map[string]string, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		m[string(kv.Key[len(prefix+"/state/"):])] = string(kv.Value)
	}
	return m
}

// model applies batches in order, the way the store must.
type model struct {
	mu sync.Mutex
	m  map[string]string
}

func (md *model) apply(ops []Op) {
	md.mu.Lock()
	defer md.mu.Unlock()
	if md.m == nil {
		md.m = make(map[string]string)
	}
	for _, op := range ops {
		if op.Delete {
			delete(md.m, op.Key)
		} else {
			md.m[op.Key] = string(op.Value)
		}
	}
}

func (md *model) snapshot() map[string]string {
	md.mu.Lock()
	defer md.mu.Unlock()
	return maps.Clone(md.m)
}

func (md *model) bytes() int64 {
	md.mu.Lock()
	defer md.mu.Unlock()
	var n int64
	for k, v := range md.m {
		n += int64(len(k) + len(v))
	}
	return n
}

func strMap(m map[string][]byte) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = string(v)
	}
	return out
}

func value(i, size int) []byte {
	b := make([]byte, size)
	s := fmt.Sprintf("value-%d-", i)
	for j := range b {
		b[j] = s[j%len(s)]
	}
	return b
}

// waitCandidates waits until n replicas campaign under prefix.
func waitCandidates(t testing.TB, cl *clientv3.Client, prefix string, n int) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		resp, err := cl.Get(ctxFor(t), prefix+"/election/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count == int64(n) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%d replicas did not campaign under %s within %v", n, prefix, wait)
}
