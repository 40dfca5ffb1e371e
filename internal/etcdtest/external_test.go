package etcdtest

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// With ETCDTEST_BINARY set, every test of this package runs its clusters
// as child processes of that binary (TestQuorum, TestTLS, TestRestartOne
// included); TestExternal adds what only processes can get wrong.

const helperEnv = "ETCDTEST_ORPHAN_HELPER"

// pgrep lists the processes whose command line holds s.
func pgrep(t *testing.T, s string) []string {
	t.Helper()
	out, err := exec.Command("pgrep", "-f", s).Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 1 {
		return nil // none
	}
	if err != nil {
		t.Fatalf("pgrep -f %s: %v", s, err)
	}
	return strings.Fields(string(out))
}

// TestExternal checks members run as processes of ETCDTEST_BINARY: a
// killed leader's peers elect another, the killed member rejoins with
// what it missed, the limits given reach the binary, and nothing outlives
// Close or a test binary that dies without it.
func TestExternal(t *testing.T) {
	if Binary() == "" {
		t.Skipf("%s is not set: members are embedded", BinaryEnv)
	}
	t.Run("kill and rejoin", func(t *testing.T) {
		c, err := New(Options{})
		if err != nil {
			t.Fatal(err)
		}
		closed := false
		defer func() {
			if !closed {
				c.Close()
			}
		}()
		if got := len(pgrep(t, c.root)); got != 3 {
			t.Fatalf("%d etcd processes under %s, want 3", got, c.root)
		}
		cl := c.Client(t)
		lead := c.Leader()
		if lead < 0 || lead != c.WaitLeader(t) {
			t.Fatalf("Leader %d, WaitLeader %d", lead, c.WaitLeader(t))
		}
		c.Kill(t, lead)
		if c.Running(lead) {
			t.Fatalf("member %d runs after Kill", lead)
		}
		next := c.WaitLeader(t)
		if next == lead {
			t.Fatalf("killed member %d still leads", lead)
		}
		if err := put(t, cl, "/while-killed", 10*time.Second); err != nil {
			t.Fatalf("put after killing the leader: %v", err)
		}
		c.Restart(t, lead)
		// The rejoined member serves what it missed from its own copy.
		one, err := c.newClient([]string{c.members[lead].clientURL.Host})
		if err != nil {
			t.Fatal(err)
		}
		defer one.Close()
		deadline := time.Now().Add(startTimeout)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			resp, err := one.Get(ctx, "/while-killed", clientv3.WithSerializable())
			cancel()
			if err == nil && len(resp.Kvs) == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("restarted member %d lacks the key written while it was down: %v %v", lead, resp, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.Stop(t, next)
		if l := c.WaitLeader(t); l == next {
			t.Fatalf("stopped member %d still leads", next)
		}
		c.Close()
		closed = true
		if left := pgrep(t, c.root); len(left) != 0 {
			t.Fatalf("etcd processes %v outlive Close", left)
		}
	})
	t.Run("limits", func(t *testing.T) {
		c := Start(t, Options{Members: 1, MaxTxnOps: 2})
		ops := []clientv3.Op{clientv3.OpPut("/a", "1"), clientv3.OpPut("/b", "2"), clientv3.OpPut("/c", "3")}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := c.Client(t).Txn(ctx).Then(ops...).Commit()
		if err == nil || !strings.Contains(err.Error(), "too many operations") {
			t.Fatalf("a 3-op txn on --max-txn-ops=2: %v, want too many operations", err)
		}
	})
	t.Run("server TLS only", func(t *testing.T) {
		c := Start(t, Options{Members: 1, TLS: true, NoClientCertAuth: true})
		if err := put(t, c.Client(t), "/a", 5*time.Second); err != nil {
			t.Fatalf("put over TLS: %v", err)
		}
	})
	t.Run("test binary killed", func(t *testing.T) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestOrphanHelper$")
		cmd.Env = append(os.Environ(), helperEnv+"=1")
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		root, err := bufio.NewReader(out).ReadString('\n')
		if err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("helper did not name its cluster: %v", err)
		}
		root = strings.TrimSpace(strings.TrimPrefix(root, "root="))
		defer os.RemoveAll(root)
		if got := len(pgrep(t, root)); got != 3 {
			t.Errorf("%d etcd processes under %s, want 3", got, root)
		}
		cmd.Process.Kill()
		cmd.Wait()
		deadline := time.Now().Add(10 * time.Second)
		for {
			left := pgrep(t, root)
			if len(left) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("etcd processes %v outlive the killed test binary", left)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// TestOrphanHelper is the test binary TestExternal kills: it starts a
// cluster, names its directory and waits to be killed (a minute at most).
func TestOrphanHelper(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("run by TestExternal")
	}
	c, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	os.Stdout.WriteString("root=" + c.root + "\n")
	time.Sleep(time.Minute)
}
