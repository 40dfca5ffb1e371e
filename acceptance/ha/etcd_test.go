//go:build ha

package ha

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/etcdtest"
)

// identity is the name a replica listening on addr advertises by default:
// <hostname>:<port>.
func identity(addr string) string {
	host, _ := os.Hostname()
	_, port, _ := net.SplitHostPort(addr)
	return host + ":" + port
}

// faultMachines is the fleet of the etcd fault tests.
const faultMachines = 32

// roleWatch polls the replicas' health until stopped and records every
// moment the set of SERVING replicas was not exactly {want}.
type roleWatch struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	odd  []string
}

func (s *replicaSet) watchRoles(want int) *roleWatch {
	w := &roleWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
			if sv := s.serving(); len(sv) != 1 || sv[0] != want {
				w.mu.Lock()
				w.odd = append(w.odd, fmt.Sprintf("%s: serving %v", time.Now().Format("15:04:05.000"), sv))
				w.mu.Unlock()
			}
		}
	}()
	return w
}

func (w *roleWatch) end() []string {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.odd
}

// TestEtcdMemberLoss kills one etcd member of three under load, first the
// raft leader, then a follower, bringing each back: the documented effect
// is none (commits continue, some take longer). The provider leader must
// keep its term throughout, and afterwards every acknowledged mutation is
// reflected as in the fail-over test.
func TestEtcdMemberLoss(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	s := startSet(t, c, "/ha/member-loss", 2, "--seed-count", fmt.Sprint(faultMachines), "--fake-latency", fakeLatency)
	lead := s.waitLeader(t)
	ld := startLoad(t, s, loadWalkers, loadPoll)
	ld.waitProgress(t, progressPerRound)
	roles := s.watchRoles(lead)
	for _, which := range []string{"the raft leader", "a follower"} {
		m := c.WaitLeader(t)
		if which == "a follower" {
			m = (m + 1) % 3
		}
		before := ld.l.unknown.Load()
		c.Kill(t, m)
		ld.waitProgress(t, progressPerRound)
		c.Restart(t, m)
		c.WaitLeader(t)
		ld.waitProgress(t, progressPerRound/2)
		t.Logf("etcd member %d (%s) killed and restarted under load: %d client attempts had to be sent again", m, which, ld.l.unknown.Load()-before)
	}
	for _, o := range roles.end() {
		t.Errorf("the provider's leadership moved while one etcd member was down (documented: nothing happens): %s", o)
	}
	verify(t, s, ld, faultMachines)
}

// TestEtcdQuorumLoss takes two of three etcd members away under load.
// Documented: commits fail within seconds, the leader's term ends and
// every replica stands by; every RPC, reads included, answers UNAVAILABLE
// until quorum returns and a replica leads again. Nothing acknowledged is
// lost, and after quorum returns the load resumes.
func TestEtcdQuorumLoss(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	s := startSet(t, c, "/ha/quorum-loss", 2, "--seed-count", fmt.Sprint(faultMachines), "--fake-latency", fakeLatency)
	s.waitLeader(t)
	ld := startLoad(t, s, loadWalkers, loadPoll)
	ld.waitProgress(t, progressPerRound)

	first := c.WaitLeader(t)
	second := (first + 1) % 3
	c.Kill(t, first)
	c.Kill(t, second)
	lost := time.Now()
	for deadline := time.Now().Add(takeoverWait); len(s.serving()) != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("replicas %v still serve %v after etcd lost quorum", s.serving(), takeoverWait)
		}
	}
	standby := time.Now()

	// Every replica refuses everything clearly, reads included.
	for i := range s.reps {
		c := s.client(i)
		for what, call := range map[string]func(ctx context.Context) error{
			"Get": func(ctx context.Context) error {
				_, err := c.Get(ctx, &pb.MachineRef{Id: "local-a/kvm.small/000"})
				return err
			},
			"List": func(ctx context.Context) error { _, err := c.List(ctx, &pb.ListFilter{}); return err },
			"Create": func(ctx context.Context) error {
				_, err := c.Create(ctx, &pb.CreateRequest{MachineId: "local-a/kvm.small/000"})
				return err
			},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
			err := call(ctx)
			cancel()
			if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "this replica is a standby") {
				t.Errorf("replica %d without etcd quorum: %s answered %v, want UNAVAILABLE from a standby", i, what, err)
			}
			// A standby that names itself as the leader sends the client
			// straight back to it.
			if self := fmt.Sprintf("the leader is %q", identity(s.reps[i].Addr())); strings.Contains(err.Error(), self) {
				t.Errorf("replica %d without etcd quorum: %s answered %v: it stands by, yet names itself as the leader", i, what, err)
			}
		}
		if code, body := s.reps[i].HTTPGet("/readyz"); code != http.StatusServiceUnavailable {
			t.Errorf("replica %d without etcd quorum: /readyz %d %s, want 503", i, code, body)
		}
	}
	// Hold the outage a while: nothing may be acknowledged meanwhile.
	time.Sleep(3 * time.Second)
	if at := ld.l.firstAckAfter(standby); !at.IsZero() {
		t.Errorf("a mutation was acknowledged at %s, while every replica stood by without etcd quorum", at.Format("15:04:05.000"))
	}

	c.RestartAll(t)
	c.WaitLeader(t)
	restored := time.Now()
	s.waitLeader(t)
	leads := time.Since(restored)
	resumed := ld.waitAckAfter(t, restored).Sub(restored)
	ld.waitProgress(t, progressPerRound)
	verify(t, s, ld, faultMachines)
	t.Logf("quorum lost -> every replica standing by: %v; quorum restored -> a replica leads: %v, -> first acknowledged mutation: %v",
		standby.Sub(lost).Round(time.Millisecond), leads.Round(time.Millisecond), resumed.Round(time.Millisecond))
}
