//go:build ha

package ha

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/etcdtest"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// binary is the provider built once by TestMain.
var binary string

func TestMain(m *testing.M) {
	if spec, ok := os.LookupEnv(bareChildEnv); ok {
		os.Exit(bareChild(spec))
	}
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	bin, cleanup, err := providertest.Build("provider-ha-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "ha:", err)
		return 1
	}
	defer cleanup()
	binary = bin
	defer stopBench()
	return m.Run()
}

// Bounds of the waits. They only keep a broken replica from hanging the
// suite; nothing asserts on how long a wait took.
const (
	// takeoverWait bounds the wait for a replica to lead after the
	// previous leader went away: several leases.
	takeoverWait = 60 * time.Second
	// callGiveUp bounds how long a leader-following call keeps trying.
	callGiveUp = 90 * time.Second
	// attemptTimeout bounds one attempt of a call on one replica; a
	// paused replica does not answer at all.
	attemptTimeout = 5 * time.Second
	// settleWait bounds the wait for a machine to reach the target of an
	// acknowledged transition.
	settleWait = 2 * time.Minute
)

// replicaSet is one etcd cluster and the provider replicas sharing a
// prefix on it.
type replicaSet struct {
	t       testing.TB
	cluster *etcdtest.Cluster
	prefix  string
	reps    []*providertest.Provider

	mu   sync.Mutex
	hint int // the replica that answered last
}

// startSet starts n replicas of `serve --use-fake-backend --state
// etcd://.../prefix` plus args, each waited for until alive (/healthz):
// a standby is never ready.
func startSet(t testing.TB, c *etcdtest.Cluster, prefix string, n int, args ...string) *replicaSet {
	t.Helper()
	s := &replicaSet{t: t, cluster: c, prefix: prefix}
	base := []string{"serve", "--use-fake-backend", "--state", c.URL(prefix), "--log-level", "info"}
	for range n {
		p := providertest.Start(t, binary, providertest.Options{
			Args:     append(append([]string(nil), base...), args...),
			WaitPath: "/healthz",
			Dial:     []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1 << 30))},
		})
		s.reps = append(s.reps, p)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i, p := range s.reps {
				t.Logf("replica %d output (tail):\n%s", i, tailLines(p.Log(), 60))
			}
		}
	})
	return s
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// health asks replica i for its gRPC health; NOT_SERVING when it does not
// answer.
func (s *replicaSet) health(i int) healthpb.HealthCheckResponse_ServingStatus {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(s.reps[i].Conn()).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return healthpb.HealthCheckResponse_NOT_SERVING
	}
	return resp.Status
}

// serving returns the replicas that report SERVING.
func (s *replicaSet) serving() []int {
	var out []int
	for i := range s.reps {
		if s.health(i) == healthpb.HealthCheckResponse_SERVING {
			out = append(out, i)
		}
	}
	return out
}

// waitLeader waits until exactly one replica reports SERVING and returns
// it. Two at once fails the test: there is one writer.
func (s *replicaSet) waitLeader(t testing.TB) int {
	t.Helper()
	deadline := time.Now().Add(takeoverWait)
	for time.Now().Before(deadline) {
		switch sv := s.serving(); len(sv) {
		case 1:
			return sv[0]
		case 0:
		default:
			t.Fatalf("replicas %v all report SERVING at once", sv)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no replica leads after %v", takeoverWait)
	return -1
}

// killLeader kills the leader (-9) and waits for another replica to lead.
// It returns both, when the old leader was gone (an answer after that
// comes from another replica) and how long the standby then took to
// report SERVING.
func (s *replicaSet) killLeader(t testing.TB) (old, next int, gone time.Time, took time.Duration) {
	t.Helper()
	old = s.waitLeader(t)
	s.reps[old].Kill()
	gone = time.Now()
	next = s.waitLeader(t)
	took = time.Since(gone)
	if next == old {
		t.Fatalf("replica %d leads again although it was killed", old)
	}
	return old, next, gone, took
}

// client is replica i's client (it follows the replica across launches).
func (s *replicaSet) client(i int) pb.CapacityProviderClient { return s.reps[i].Client() }

// outcomeUnknown reports whether err leaves open whether the call took
// effect on a leader, so that it must be sent again (to another replica):
// the replica stood by, died, or did not answer in time.
func outcomeUnknown(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return false
}

// call runs f against the replica that answered last and, while the
// outcome is unknown, against the others in turn, until an answer that
// settles it (OK or a definite error) or callGiveUp. fresh is called
// before every attempt (a mutation takes a new fencing token there). It
// returns how many attempts had an unknown outcome and the definite
// answer's error.
func (s *replicaSet) call(fresh func(), f func(ctx context.Context, c pb.CapacityProviderClient) error) (unknown int, err error) {
	s.mu.Lock()
	i := s.hint
	s.mu.Unlock()
	deadline := time.Now().Add(callGiveUp)
	for tries := 0; ; tries++ {
		if fresh != nil {
			fresh()
		}
		ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
		err = f(ctx, s.client(i))
		cancel()
		if !outcomeUnknown(err) {
			s.mu.Lock()
			s.hint = i
			s.mu.Unlock()
			return unknown, err
		}
		unknown++
		if time.Now().After(deadline) {
			return unknown, fmt.Errorf("no replica answered within %v: %w", callGiveUp, err)
		}
		i = (i + 1) % len(s.reps)
		if i == 0 || len(s.reps) == 1 {
			time.Sleep(25 * time.Millisecond)
		}
	}
}

// get reads one machine from whichever replica leads.
func (s *replicaSet) get(t testing.TB, id string) *pb.Machine {
	t.Helper()
	var m *pb.Machine
	_, err := s.call(nil, func(ctx context.Context, c pb.CapacityProviderClient) error {
		var err error
		m, err = c.Get(ctx, &pb.MachineRef{Id: id})
		return err
	})
	if err != nil {
		t.Fatalf("Get %s: %v", id, err)
	}
	return m
}

// list lists from whichever replica leads.
func (s *replicaSet) list(t testing.TB, states ...pb.MachineState) []*pb.Machine {
	t.Helper()
	var l *pb.MachineList
	_, err := s.call(nil, func(ctx context.Context, c pb.CapacityProviderClient) error {
		var err error
		l, err = c.List(ctx, &pb.ListFilter{States: states})
		return err
	})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return l.Machines
}

// etcdRev is the cluster's current revision.
func etcdRev(t testing.TB, cl *clientv3.Client, key string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cl.Get(ctx, key)
	if err != nil {
		t.Fatalf("etcd get %s: %v", key, err)
	}
	return resp.Header.Revision
}

// pause stops replica i (SIGSTOP) and waits until the kernel reports it
// stopped, so nothing it answers afterwards predates the pause.
func (s *replicaSet) pause(t testing.TB, i int) {
	t.Helper()
	s.reps[i].Stop()
	pid := s.reps[i].Pid()
	for deadline := time.Now().Add(10 * time.Second); procState(pid) != "T"; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("replica %d (pid %d) is in state %q after SIGSTOP, want T", i, pid, procState(pid))
		}
	}
}

// procState is the state letter in /proc/pid/stat (R, S, T, Z...).
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	st := string(b)
	if i := strings.LastIndexByte(st, ')'); i >= 0 && i+2 < len(st) {
		return st[i+2 : i+3]
	}
	return ""
}
