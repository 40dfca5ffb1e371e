package freeport

import (
	"net"
	"strconv"
	"testing"
)

// TestAddrsAvoidEphemeralPorts is the regression test of a CI failure:
// etcdtest picked member ports by listening on port 0, which hands out an
// ephemeral port, and a member dialling its peers at start-up took one as
// its source port before the neighbour it was picked for could listen.
func TestAddrsAvoidEphemeralPorts(t *testing.T) {
	lo, hi := ephemeral()
	seen := map[string]bool{}
	for range 50 {
		addrs := addrs(t, 6)
		local := map[string]bool{}
		for _, a := range addrs {
			host, p, err := net.SplitHostPort(a)
			if err != nil {
				t.Fatal(err)
			}
			port, _ := strconv.Atoi(p)
			if host != "127.0.0.1" {
				t.Errorf("%s: host %s, want 127.0.0.1", a, host)
			}
			if port >= lo && port <= hi {
				t.Errorf("%s lies in the ephemeral range %d-%d", a, lo, hi)
			}
			if port < lowest {
				t.Errorf("%s lies below %d", a, lowest)
			}
			if local[a] {
				t.Errorf("%s handed out twice in one call %v", a, addrs)
			}
			local[a] = true
			seen[a] = true
		}
	}
	if len(seen) < 100 {
		t.Errorf("300 ports drew only %d distinct addresses: the pick is not spread", len(seen))
	}
}

// TestAddrsAreFree: every address handed out can be listened on, also
// when a port of the range is held by someone else.
func TestAddrsAreFree(t *testing.T) {
	held := hold(t)
	for _, a := range addrs(t, 200) {
		if a == held.Addr().String() {
			t.Fatalf("%s handed out while held", a)
		}
		l, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("listen on a handed-out address: %v", err)
		}
		l.Close()
	}
}

func TestInUse(t *testing.T) {
	_, err := net.Listen("tcp", hold(t).Addr().String())
	if !InUse(err) {
		t.Fatalf("InUse(%v) = false", err)
	}
	if InUse(nil) {
		t.Fatal("InUse(nil)")
	}
}

func addrs(t *testing.T, n int) []string {
	t.Helper()
	a, err := Addrs(n)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// hold listens on an address Addrs handed out until the test ends.
func hold(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", addrs(t, 1)[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}
