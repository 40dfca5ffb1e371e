//go:build ha

package ha

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/etcdtest"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// electionLeader reads the election under prefix: the leading replica's
// lease (hex, as the store writes it into PREFIX/writer) and identity.
func electionLeader(t testing.TB, cl *clientv3.Client, prefix string) (lease, identity string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cl.Get(ctx, prefix+"/election/", clientv3.WithFirstCreate()...)
	if err != nil {
		t.Fatalf("read the election: %v", err)
	}
	if len(resp.Kvs) == 0 {
		t.Fatal("no election key")
	}
	kv := resp.Kvs[0]
	return strings.TrimPrefix(string(kv.Key), prefix+"/election/"), string(kv.Value)
}

// answer is one RPC's outcome.
type answer struct {
	what string
	ok   bool
	err  error
	body string
}

// TestZombieLeader pauses the leader (SIGSTOP) past its lease while it has
// work in flight and requests queued, lets the standby take over and
// accept mutations, then resumes the old leader (SIGCONT). Watching the
// prefix in etcd, every write after the resume must be the new leader's
// (the store stamps PREFIX/writer with "<lease>/<n>" in every txn); the
// resumed replica must answer nothing it cannot keep current (no OK to
// the requests queued while it was paused), report NOT_SERVING and stand
// by, naming the new leader.
func TestZombieLeader(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cl := c.Client(t)
	const prefix = "/ha/zombie"
	s := startSet(t, c, prefix, 2, "--seed-count", "16", "--fake-latency", "150ms")
	a := s.waitLeader(t)
	b := 1 - a
	ca, cb := s.client(a), s.client(b)
	leaseA, _ := electionLeader(t, cl, prefix)
	spec := s.list(t, providertest.StSpeculative)
	x, y := spec[0].Id, spec[1].Id
	ctx := func() context.Context {
		c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		t.Cleanup(cancel)
		return c
	}

	// X is IDLE with a known operation id; more machines are being
	// created when the leader freezes.
	if _, err := ca.Create(ctx(), &pb.CreateRequest{MachineId: x}); err != nil {
		t.Fatal(err)
	}
	waitState(t, s, x, providertest.StIdle)
	for _, m := range spec[2:8] {
		if _, err := ca.Create(ctx(), &pb.CreateRequest{MachineId: m.Id}); err != nil {
			t.Fatal(err)
		}
	}

	s.pause(t, a)
	// Requests that reach the frozen leader wait in its socket and are
	// read the moment it resumes.
	var mu sync.Mutex
	var queued []answer
	var wg sync.WaitGroup
	ask := func(what string, f func(ctx context.Context) (string, error)) {
		wg.Go(func() {
			c, cancel := context.WithTimeout(context.Background(), 2*takeoverWait)
			defer cancel()
			body, err := f(c)
			mu.Lock()
			queued = append(queued, answer{what: what, ok: err == nil, err: err, body: body})
			mu.Unlock()
		})
	}
	ask("Get X", func(c context.Context) (string, error) {
		m, err := ca.Get(c, &pb.MachineRef{Id: x})
		return fmt.Sprint(m.GetState()), err
	})
	ask("List", func(c context.Context) (string, error) {
		l, err := ca.List(c, &pb.ListFilter{})
		return fmt.Sprintf("%d machines", len(l.GetMachines())), err
	})
	ask("Create X again (idempotent retry)", func(c context.Context) (string, error) {
		a, err := ca.Create(c, &pb.CreateRequest{MachineId: x})
		return a.GetOperationId(), err
	})
	ask("Create Y", func(c context.Context) (string, error) {
		a, err := ca.Create(c, &pb.CreateRequest{MachineId: y, ShardId: "zombie", ShardEpoch: 1, SequenceNumber: 1})
		return a.GetOperationId(), err
	})

	// The standby takes over and accepts mutations: X goes back to
	// SPECULATIVE, Y is created with a token newer than the queued one.
	if got := s.waitLeader(t); got != b {
		t.Fatalf("replica %d leads, want the standby %d", got, b)
	}
	leaseB, identityB := electionLeader(t, cl, prefix)
	if leaseB == leaseA {
		t.Fatalf("the election still names the paused leader's lease %s", leaseA)
	}
	if _, err := cb.Delete(ctx(), &pb.DeleteRequest{MachineId: x}); err != nil {
		t.Fatalf("Delete X on the new leader: %v", err)
	}
	if _, err := cb.Create(ctx(), &pb.CreateRequest{MachineId: y, ShardId: "zombie", ShardEpoch: 1, SequenceNumber: 2}); err != nil {
		t.Fatalf("Create Y on the new leader: %v", err)
	}
	waitState(t, s, x, providertest.StSpeculative)
	waitState(t, s, y, providertest.StIdle)

	// From here on, watch every write under the prefix.
	from := etcdRev(t, cl, prefix+"/writer") + 1
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	watch := cl.Watch(wctx, prefix+"/", clientv3.WithPrefix(), clientv3.WithRev(from))

	s.reps[a].Cont()
	wg.Wait()
	// The resumed replica stands by: NOT_SERVING, not ready, and every RPC
	// answers UNAVAILABLE naming the new leader.
	deadline := time.Now().Add(takeoverWait)
	for s.health(a) != healthpb.HealthCheckResponse_NOT_SERVING {
		if time.Now().After(deadline) {
			t.Fatalf("the resumed leader still reports SERVING after %v", takeoverWait)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, body := s.reps[a].HTTPGet("/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("resumed leader /readyz: %d %s, want 503", code, body)
	}
	// The identity is quoted (it is the other replica's, unescaped input).
	want := fmt.Sprintf("this replica is a standby; the leader is %q", identityB)
	for deadline := time.Now().Add(takeoverWait); ; time.Sleep(20 * time.Millisecond) {
		_, err := ca.Get(ctx(), &pb.MachineRef{Id: x})
		if status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("resumed leader: Get answers %v, want UNAVAILABLE %q", err, want)
		}
	}
	for what, call := range map[string]func() error{
		"Create": func() error {
			_, err := ca.Create(ctx(), &pb.CreateRequest{MachineId: spec[9].Id})
			return err
		},
		"List": func() error { _, err := ca.List(ctx(), &pb.ListFilter{}); return err },
	} {
		if err := call(); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), want) {
			t.Errorf("resumed leader: %s answers %v, want UNAVAILABLE %q", what, err, want)
		}
	}

	// The new leader keeps leading and writing.
	for _, m := range spec[9:12] {
		if _, err := cb.Create(ctx(), &pb.CreateRequest{MachineId: m.Id}); err != nil {
			t.Fatalf("Create %s on the new leader after the resume: %v", m.Id, err)
		}
		waitState(t, s, m.Id, providertest.StIdle)
	}
	if sv := s.serving(); len(sv) != 1 || sv[0] != b {
		t.Errorf("replicas %v serve after the resume, want only %d", sv, b)
	}

	// Every write since the resume is attributed.
	until := etcdRev(t, cl, prefix+"/writer")
	writes := collect(t, watch, until)
	stopWatch()
	for _, p := range attributionProblems(prefix, writes, leaseA, leaseB) {
		t.Error(p)
	}
	t.Logf("%d txns under %s after the resume, all by the new leader (lease %s)", len(writes), prefix, leaseB)

	// The requests queued while the leader was frozen: nothing may be
	// acknowledged or read from the document it no longer owns.
	for _, q := range queued {
		if q.ok {
			t.Errorf("the resumed leader answered %q OK (%s) from a term that had ended", q.what, q.body)
		} else if status.Code(q.err) != codes.Unavailable {
			t.Errorf("the resumed leader answered %q with %v, want UNAVAILABLE", q.what, q.err)
		}
	}
	// Y's queued token (1) is stale now; X was deleted by the new leader.
	if m := s.get(t, x); m.State != providertest.StSpeculative {
		t.Errorf("X is %v, want SPECULATIVE (the new leader deleted it)", m.State)
	}
	if _, err := cb.Create(ctx(), &pb.CreateRequest{MachineId: y, ShardId: "zombie", ShardEpoch: 1, SequenceNumber: 1}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("the queued token on Y: %v, want FailedPrecondition", err)
	}
}

// waitState polls the leader until machine id is in want.
func waitState(t testing.TB, s *replicaSet, id string, want pb.MachineState) {
	t.Helper()
	providertest.WaitFor(t, func() *pb.Machine { return s.get(t, id) }, id, want, settleWait)
}

// txnWrites are the events of one etcd revision (one txn).
type txnWrites struct {
	rev    int64
	events []*clientv3.Event
}

// collect reads watch events until revision until, grouped by revision.
func collect(t testing.TB, watch clientv3.WatchChan, until int64) []txnWrites {
	t.Helper()
	var out []txnWrites
	timeout := time.After(30 * time.Second)
	for len(out) == 0 || out[len(out)-1].rev < until {
		select {
		case wr, ok := <-watch:
			if !ok || wr.Err() != nil {
				t.Fatalf("watch ended: %v", wr.Err())
			}
			for _, ev := range wr.Events {
				if len(out) == 0 || out[len(out)-1].rev != ev.Kv.ModRevision {
					out = append(out, txnWrites{rev: ev.Kv.ModRevision})
				}
				out[len(out)-1].events = append(out[len(out)-1].events, ev)
			}
			if wr.Header.Revision >= until && (len(out) == 0 || out[len(out)-1].rev >= until) {
				return out
			}
		case <-timeout:
			t.Fatalf("the watch did not reach revision %d", until)
		}
	}
	return out
}

// attributionProblems checks that every txn touching the document or the
// writer key was made by the leader holding leaseB (its PREFIX/writer
// value starts with that lease), and that election changes are only the
// paused leader's old key going and standbys campaigning with new keys.
func attributionProblems(prefix string, writes []txnWrites, leaseA, leaseB string) []string {
	var p []string
	for _, w := range writes {
		data, writer := false, ""
		for _, ev := range w.events {
			key := string(ev.Kv.Key)
			switch {
			case key == prefix+"/writer":
				if ev.Type == mvccpb.PUT {
					writer = string(ev.Kv.Value)
				} else {
					p = append(p, fmt.Sprintf("revision %d deletes %s", w.rev, key))
				}
			case strings.HasPrefix(key, prefix+"/state/"):
				data = true
			case strings.HasPrefix(key, prefix+"/election/"):
				lease := strings.TrimPrefix(key, prefix+"/election/")
				switch {
				case ev.Type == mvccpb.DELETE && lease == leaseB:
					p = append(p, fmt.Sprintf("revision %d deletes the new leader's election key", w.rev))
				case ev.Type == mvccpb.PUT && (lease == leaseA || ev.Kv.CreateRevision != ev.Kv.ModRevision):
					p = append(p, fmt.Sprintf("revision %d rewrites election key %s (lease %s)", w.rev, key, lease))
				}
			default:
				p = append(p, fmt.Sprintf("revision %d writes %s, outside the store's layout", w.rev, key))
			}
		}
		if writer == "" && data {
			p = append(p, fmt.Sprintf("revision %d changes the document without stamping %s/writer", w.rev, prefix))
		}
		if writer != "" && !strings.HasPrefix(writer, leaseB+"/") {
			p = append(p, fmt.Sprintf("revision %d was written by lease %s (writer %q), not the new leader's %s", w.rev, strings.Split(writer, "/")[0], writer, leaseB))
		}
	}
	return p
}
