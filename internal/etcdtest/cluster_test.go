package etcdtest

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/bigfleet-vm/provider/internal/freeport"
)

func put(t *testing.T, cl *clientv3.Client, key string, timeout time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, err := cl.Put(clientv3.WithRequireLeader(ctx), key, "v")
	return err
}

// TestQuorum walks a three-member cluster through losing one member
// (writes go on), losing two (writes fail) and getting them back.
func TestQuorum(t *testing.T) {
	c := Start(t, Options{})
	cl := c.Client(t)
	if err := put(t, cl, "/a", 5*time.Second); err != nil {
		t.Fatalf("put on a healthy cluster: %v", err)
	}
	lead := c.Leader()
	c.Stop(t, lead)
	c.WaitLeader(t)
	if err := put(t, cl, "/b", 10*time.Second); err != nil {
		t.Fatalf("put with one member stopped: %v", err)
	}
	other := (lead + 1) % 3
	c.Stop(t, other)
	if err := put(t, cl, "/c", 3*time.Second); err == nil {
		t.Fatal("put without quorum succeeded")
	}
	c.RestartAll(t)
	c.WaitLeader(t)
	if err := put(t, cl, "/d", 10*time.Second); err != nil {
		t.Fatalf("put after restoring quorum: %v", err)
	}
	resp, err := cl.Get(context.Background(), "/b")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get /b after restart: %v %v", resp, err)
	}
}

// TestTLS checks that a TLS cluster serves a client with the generated
// client certificate.
func TestTLS(t *testing.T) {
	c := Start(t, Options{Members: 1, TLS: true})
	if err := put(t, c.Client(t), "/a", 5*time.Second); err != nil {
		t.Fatalf("put over TLS: %v", err)
	}
}

// TestRestartOne stops one member and brings it back; it catches up.
func TestRestartOne(t *testing.T) {
	c := Start(t, Options{})
	cl := c.Client(t)
	c.Stop(t, 2)
	if err := put(t, cl, "/while-down", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	c.Restart(t, 2)
	if !c.Running(2) {
		t.Fatal("member 2 does not run after Restart")
	}
	c.Kill(t, 0)
	c.Kill(t, 1)
	c.Restart(t, 0)
	c.WaitLeader(t)
	resp, err := cl.Get(context.Background(), "/while-down")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("key written while member 2 was down: %v %v", resp, err)
	}
}

// TestNewRetriesTakenPort: a member whose port another process took
// between the pick and its bind (CI saw "bind: address already in use")
// costs New a new set of ports, not the test.
func TestNewRetriesTakenPort(t *testing.T) {
	var taken net.Listener
	picks := 0
	pickAddrs = func(n int) ([]string, error) {
		picks++
		addrs, err := freeport.Addrs(n)
		if err != nil || picks > 1 {
			return addrs, err
		}
		// The first set loses member m1's client port.
		if taken, err = net.Listen("tcp", addrs[2]); err != nil {
			t.Fatal(err)
		}
		return addrs, nil
	}
	t.Cleanup(func() {
		pickAddrs = freeport.Addrs
		taken.Close()
	})
	c := Start(t, Options{})
	if picks != 2 {
		t.Fatalf("%d picks of ports, want 2", picks)
	}
	for _, ep := range c.Endpoints() {
		if ep == taken.Addr().String() {
			t.Fatalf("cluster serves on the taken address %s", ep)
		}
	}
	if err := put(t, c.Client(t), "/a", 5*time.Second); err != nil {
		t.Fatalf("put on the cluster on new ports: %v", err)
	}
}

// TestCompactionRetention checks that members compact with the retention
// Options names: with 1s, a revision written now is compacted away within
// a few seconds (the package's 10s would not be before the deadline).
func TestCompactionRetention(t *testing.T) {
	c := Start(t, Options{Members: 1, CompactionRetention: "1s"})
	cl := c.Client(t)
	if err := put(t, cl, "/a", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// Every call, and the wait as a whole, ends within the deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first, err := cl.Get(ctx, "/a")
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(6 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		// Later writes give the compactor revisions to move past.
		if err := put(t, cl, "/b", 5*time.Second); err != nil {
			t.Fatal(err)
		}
		_, err := cl.Get(ctx, "/a", clientv3.WithRev(first.Header.Revision))
		if errors.Is(err, rpctypes.ErrCompacted) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("revision %d was not compacted in 6s with a 1s retention", first.Header.Revision)
		}
	}
}
