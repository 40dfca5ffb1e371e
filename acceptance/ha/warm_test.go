//go:build ha

package ha

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/etcdtest"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// warmTaken is what a new leader logs when its term starts from its
// warm copy.
const warmTaken = `msg="state taken from the warm standby's copy"`

// startStandbyVia starts one more replica of s whose etcd endpoints are
// the given proxies (so the test can cut its network alone) and waits
// until its copy of the state is loaded.
func startStandbyVia(t *testing.T, s *replicaSet, proxies []*etcdtest.Proxy, args ...string) {
	t.Helper()
	var eps []string
	for _, p := range proxies {
		eps = append(eps, p.Addr)
	}
	url := "etcd://" + strings.Join(eps, ",") + "/" + strings.TrimPrefix(s.prefix, "/")
	p := providertest.Start(t, binary, providertest.Options{
		Args:     append([]string{"serve", "--use-fake-backend", "--state", url, "--log-level", "info"}, args...),
		WaitPath: "/healthz",
		Dial:     []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1 << 30))},
	})
	s.reps = append(s.reps, p)
	waitLog(t, p, warmLine, 1)
}

// waitLog waits until replica p's current process logged line n times.
func waitLog(t *testing.T, p *providertest.Provider, line string, n int) {
	t.Helper()
	for deadline := time.Now().Add(takeoverWait); strings.Count(p.Output(), line) < n; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("replica did not log %s %d times within %v:\n%s", line, n, takeoverWait, tailLines(p.Output(), 40))
		}
	}
}

// createAcked creates each machine on the leader and fails the test
// unless every Create is acknowledged.
func createAcked(t *testing.T, s *replicaSet, ids []string) {
	t.Helper()
	for _, id := range ids {
		if _, err := s.call(nil, func(ctx context.Context, c pb.CapacityProviderClient) error {
			_, err := c.Create(ctx, &pb.CreateRequest{MachineId: id})
			return err
		}); err != nil {
			t.Fatalf("Create %s: %v", id, err)
		}
	}
}

// checkNotSpeculative fails the test for every acknowledged Create the
// current leader does not know.
func checkNotSpeculative(t *testing.T, s *replicaSet, ids []string) {
	t.Helper()
	for _, id := range ids {
		if m := s.get(t, id); m.State == providertest.StSpeculative {
			t.Errorf("machine %s is SPECULATIVE after the takeover: its acknowledged Create was lost", id)
		}
	}
}

// TestWarmStandbyBrokenWatch breaks the standby's watch just before it
// must take over, and the takeover still starts from the whole committed
// document:
//
//   - compacted: the standby's network is cut while the leader
//     acknowledges Creates, etcd compacts past the standby's revision,
//     the network comes back (the watch resumes, etcd answers that its
//     revision is compacted) and the leader is killed (-9) at once;
//   - cancelled: the standby talks to one etcd member only; the two
//     others die, its member loses its leader and etcd cancels the
//     standby's watch (it requires a leader); quorum returns, the leader
//     acknowledges Creates and is killed.
//
// After each, every acknowledged Create is there and the new leader
// accepts mutations.
func TestWarmStandbyBrokenWatch(t *testing.T) {
	t.Run("compacted", func(t *testing.T) {
		c := etcdtest.Start(t, etcdtest.Options{})
		s := startSet(t, c, "/ha/warm-compacted", 1, "--seed-count", "16")
		s.waitLeader(t)
		proxies := c.Proxies(t)
		startStandbyVia(t, s, proxies, "--seed-count", "16")
		pool := ids(s.list(t, providertest.StSpeculative))
		before, during := pool[:4], pool[4:10]
		createAcked(t, s, before)

		for _, p := range proxies {
			p.Blackhole()
		}
		createAcked(t, s, during)
		cl := c.Client(t)
		ctx, cancel := context.WithTimeout(context.Background(), takeoverWait)
		defer cancel()
		head, err := cl.Get(ctx, "/no-such-key")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Compact(ctx, head.Header.Revision); err != nil {
			t.Fatal(err)
		}
		for _, p := range proxies {
			p.Heal()
		}
		old, next, _, _ := s.killLeader(t)
		if old != 0 || next != 1 {
			t.Fatalf("replica %d took over from %d; want the standby 1 from 0", next, old)
		}
		checkNotSpeculative(t, s, append(before, during...))
		createAcked(t, s, pool[10:12])
		out := s.reps[1].Output()
		if !strings.Contains(out, "required revision has been compacted") {
			t.Errorf("the standby's watch was never told of the compaction:\n%s", tailLines(out, 40))
		}
		if !strings.Contains(out, warmTaken) {
			t.Errorf("the new leader did not start from its reloaded copy:\n%s", tailLines(out, 40))
		}
		t.Logf("standby's follow and load lines:\n%s", grepLines(out, "follow", "warm", "state loaded", "leading"))
	})

	t.Run("cancelled", func(t *testing.T) {
		c := etcdtest.Start(t, etcdtest.Options{})
		s := startSet(t, c, "/ha/warm-cancelled", 1, "--seed-count", "16")
		s.waitLeader(t)
		startStandbyVia(t, s, c.Proxies(t)[2:], "--seed-count", "16")
		pool := ids(s.list(t, providertest.StSpeculative))
		createAcked(t, s, pool[:4])

		c.Kill(t, 0)
		c.Kill(t, 1)
		waitLog(t, s.reps[1], "no leader", 1)
		c.Restart(t, 0)
		c.Restart(t, 1)
		c.WaitLeader(t)
		leader := s.waitLeader(t)
		createAcked(t, s, pool[4:10])
		if leader == 1 {
			t.Log("the standby whose watch was cancelled leads since quorum returned; the other replica takes over instead")
		} else {
			waitLog(t, s.reps[1], warmLine, 2) // loaded again since the cancel
		}
		old, next, _, _ := s.killLeader(t)
		t.Logf("replica %d took over from %d", next, old)
		checkNotSpeculative(t, s, pool[:10])
		createAcked(t, s, pool[10:12])
		t.Logf("standby's follow and load lines:\n%s", grepLines(s.reps[next].Output(), "follow", "warm", "state loaded", "leading"))
	})
}

// grepLines returns the lines of out holding any of words.
func grepLines(out string, words ...string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		for _, w := range words {
			if strings.Contains(l, w) {
				keep = append(keep, l)
				break
			}
		}
	}
	return strings.Join(keep, "\n")
}
