//go:build ha

package ha

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/google/go-cmp/cmp"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

var transitional = []pb.MachineState{providertest.StCreating, providertest.StConfiguring, providertest.StDraining, providertest.StDeleting}

// step is one transition of a machine's walk.
type step struct {
	kind              string
	from, through, to pb.MachineState
}

// walk is every transition, in the only order the lifecycle allows.
var walk = []step{
	{"create", providertest.StSpeculative, providertest.StCreating, providertest.StIdle},
	{"configure", providertest.StIdle, providertest.StConfiguring, providertest.StConfigured},
	{"drain", providertest.StConfigured, providertest.StDraining, providertest.StIdle},
	{"delete", providertest.StIdle, providertest.StDeleting, providertest.StSpeculative},
}

// documentedFailures are the last_error texts a machine may end FAILED
// with after a fail-over (docs/high-availability.md, "The leader"): only a
// Configure whose bootstrap blob never reached the guest before the leader
// that accepted it died (the blob is never stored). A guest command that
// had started is followed through the guest's record of it.
var documentedFailures = []string{
	blobNeverDelivered,
}

func documentedFailure(lastError string) bool {
	for _, d := range documentedFailures {
		if strings.Contains(lastError, d) {
			return true
		}
	}
	return false
}

// token is a fencing token.
type token struct {
	shard      string
	epoch, seq int64
}

// mutate sends one mutating RPC of kind for machine id with token k.
func mutate(ctx context.Context, c pb.CapacityProviderClient, kind, id, cluster string, k token) (*pb.TransitionAck, error) {
	switch kind {
	case "create":
		return c.Create(ctx, &pb.CreateRequest{MachineId: id, ShardId: k.shard, ShardEpoch: k.epoch, SequenceNumber: k.seq})
	case "configure":
		return c.Configure(ctx, &pb.ConfigureRequest{MachineId: id, ClusterId: cluster, BootstrapBlob: []byte("#!/bin/sh\necho joined\n"),
			ShardMetadata: map[string]string{"cycle": cluster}, ShardId: k.shard, ShardEpoch: k.epoch, SequenceNumber: k.seq})
	case "drain":
		return c.Drain(ctx, &pb.DrainRequest{MachineId: id, ShardId: k.shard, ShardEpoch: k.epoch, SequenceNumber: k.seq})
	case "delete":
		return c.Delete(ctx, &pb.DeleteRequest{MachineId: id, ShardId: k.shard, ShardEpoch: k.epoch, SequenceNumber: k.seq})
	}
	panic("unknown kind " + kind)
}

// transition names one accepted transition: a machine's nth walk and the
// step in it.
type transition struct {
	machine string
	cycle   int
	kind    string
}

func (tr transition) String() string { return fmt.Sprintf("%s #%d %s", tr.machine, tr.cycle, tr.kind) }

// ack is the last acknowledged transition of a machine.
type ack struct {
	tr      transition
	step    step
	op      string
	cluster string
}

// ledger is what the clients were told: every OK answer, and what the
// final checks compare the final leader against.
type ledger struct {
	t testing.TB

	mu        sync.Mutex
	ops       map[string]transition // operation id -> the transition it acknowledged
	byTr      map[transition]string // transition -> its operation id
	last      map[string]ack        // machine -> its last acknowledged transition
	mark      map[string]token      // machine -> the newest acknowledged token
	failed    map[string]string     // machine -> the documented last_error it ended with
	ackTimes  []time.Time
	unacked   int // transitions applied though no attempt was acknowledged
	unknown   atomic.Int64
	completed atomic.Int64 // transitions that reached their target
}

func newLedger(t testing.TB) *ledger {
	return &ledger{t: t, ops: map[string]transition{}, byTr: map[transition]string{}, last: map[string]ack{},
		mark: map[string]token{}, failed: map[string]string{}}
}

// record enters an OK answer: an operation id belongs to one transition,
// and a transition has one operation id however often it is retried.
func (l *ledger) record(a ack, k token) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if prev, ok := l.ops[a.op]; ok && prev != a.tr {
		l.t.Errorf("operation id %q acknowledged %v and, earlier, %v: operation ids repeat", a.op, a.tr, prev)
	}
	if prev, ok := l.byTr[a.tr]; ok && prev != a.op {
		l.t.Errorf("%v acknowledged with operation id %q, earlier with %q", a.tr, a.op, prev)
	}
	l.ops[a.op], l.byTr[a.tr] = a.tr, a.op
	l.last[a.tr.machine] = a
	if k.shard != "" {
		l.mark[a.tr.machine] = k
	}
	l.ackTimes = append(l.ackTimes, time.Now())
}

// firstAckAfter is the first OK answer after t0, or the zero time.
func (l *ledger) firstAckAfter(t0 time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := sort.Search(len(l.ackTimes), func(i int) bool { return l.ackTimes[i].After(t0) })
	if i == len(l.ackTimes) {
		return time.Time{}
	}
	return l.ackTimes[i]
}

// waitAckAfter waits for the first OK answer after t0 and returns its
// time.
func (ld *load) waitAckAfter(t testing.TB, t0 time.Time) time.Time {
	t.Helper()
	deadline := time.Now().Add(settleWait)
	for {
		if at := ld.l.firstAckAfter(t0); !at.IsZero() {
			return at
		}
		if t.Failed() {
			t.FailNow()
		}
		if time.Now().After(deadline) {
			t.Fatalf("no mutation acknowledged within %v", settleWait)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// walker walks its own machines through every transition with its own
// fencing shard, following the leader.
type walker struct {
	s        *replicaSet
	l        *ledger
	shard    string
	seq      int64
	machines []string
	poll     time.Duration
	rng      *rand.Rand
}

// run walks until stop is closed; a transition already sent is followed
// to its end first.
func (w *walker) run(stop <-chan struct{}) {
	cycle := map[string]int{}
	retired := map[string]bool{}
	for {
		active := 0
		for _, id := range w.machines {
			if retired[id] {
				continue
			}
			active++
			cycle[id]++
			for _, st := range walk {
				select {
				case <-stop:
					return
				default:
				}
				// Think time, so the walkers do not march in step and a
				// kill finds every kind of transition in flight.
				time.Sleep(time.Duration(w.rng.Int64N(int64(4 * w.poll))))
				ok, err := w.transition(id, cycle[id], st)
				if err != nil {
					w.l.t.Errorf("walker %s: %v", w.shard, err)
					return
				}
				if !ok {
					retired[id] = true
					break
				}
			}
		}
		if active == 0 {
			// Every machine failed (documented); wait for the end.
			<-stop
			return
		}
	}
}

// transition sends st for machine id until an answer settles it, follows
// the machine to st's target, and sends it once more to check the
// operation id is kept. It returns false when the machine ended FAILED
// for a documented reason (it is retired), and an error when a guarantee
// broke.
func (w *walker) transition(id string, cycle int, st step) (bool, error) {
	tr := transition{machine: id, cycle: cycle, kind: st.kind}
	cluster := fmt.Sprintf("cl-%d", cycle%4)
	var a *pb.TransitionAck
	var k token
	unknown, err := w.s.call(func() {
		w.seq++
		k = token{shard: w.shard, epoch: 1, seq: w.seq}
	}, func(ctx context.Context, c pb.CapacityProviderClient) error {
		var err error
		a, err = mutate(ctx, c, st.kind, id, cluster, k)
		return err
	})
	w.l.unknown.Add(int64(unknown))
	if err != nil {
		return w.refused(tr, st, err, unknown > 0)
	}
	if a.GetOperationId() == "" {
		return false, fmt.Errorf("%v: ack without operation_id: %v", tr, a)
	}
	w.l.record(ack{tr: tr, step: st, op: a.OperationId, cluster: cluster}, k)
	if got := a.GetMachine().GetState(); got != st.through && got != st.to {
		return false, fmt.Errorf("%v: ack snapshot in %v, want %v or %v", tr, got, st.through, st.to)
	}
	ok, err := w.settle(tr, st)
	if !ok || err != nil {
		return ok, err
	}
	return w.resend(tr, st, a.OperationId, cluster)
}

// refused handles a definite error for st: the machine ended FAILED for
// a documented reason (an attempt whose outcome was unknown had been
// applied and was then interrupted), or such an attempt already took the
// machine to st's target; anything else breaks the contract.
func (w *walker) refused(tr transition, st step, err error, hadUnknown bool) (bool, error) {
	m, gerr := w.get(tr.machine)
	if gerr != nil {
		return false, fmt.Errorf("%v refused (%v), then Get: %v", tr, err, gerr)
	}
	switch {
	case m.State == providertest.StFailed && hadUnknown && documentedFailure(m.LastError):
		w.l.mu.Lock()
		w.l.failed[tr.machine] = m.LastError
		w.l.mu.Unlock()
		return false, nil
	case hadUnknown && (m.State == st.through || m.State == st.to):
		w.l.mu.Lock()
		w.l.unacked++
		w.l.mu.Unlock()
		return w.settle(tr, st)
	}
	return false, fmt.Errorf("%v refused: %v (machine %v, last_error %q)", tr, err, m.State, m.LastError)
}

// settle polls the machine until it reaches st's target. Seeing it back
// in st's source state means an acknowledged transition was lost.
func (w *walker) settle(tr transition, st step) (bool, error) {
	deadline := time.Now().Add(settleWait)
	for {
		m, err := w.get(tr.machine)
		if err != nil {
			return false, fmt.Errorf("%v: Get while waiting for %v: %w", tr, st.to, err)
		}
		switch m.State {
		case st.to:
			w.l.completed.Add(1)
			return true, nil
		case st.through:
		case st.from:
			return false, fmt.Errorf("%v was acknowledged, but the machine is back in %v: the transition was lost", tr, st.from)
		case providertest.StFailed:
			if documentedFailure(m.LastError) {
				w.l.mu.Lock()
				w.l.failed[tr.machine] = m.LastError
				w.l.mu.Unlock()
				return false, nil
			}
			return false, fmt.Errorf("%v: machine FAILED: %q", tr, m.LastError)
		default:
			return false, fmt.Errorf("%v: machine in %v, want %v or %v", tr, m.State, st.through, st.to)
		}
		if time.Now().After(deadline) {
			return false, fmt.Errorf("%v: still %v after %v", tr, m.State, settleWait)
		}
		time.Sleep(w.poll)
	}
}

// resend repeats the settled transition (unfenced): the same operation
// id, since the machine is at its target. Delete on the SPECULATIVE
// machine it produced may instead be refused, never as fenced.
func (w *walker) resend(tr transition, st step, op, cluster string) (bool, error) {
	var a *pb.TransitionAck
	_, err := w.s.call(nil, func(ctx context.Context, c pb.CapacityProviderClient) error {
		var err error
		a, err = mutate(ctx, c, st.kind, tr.machine, cluster, token{})
		return err
	})
	switch {
	case err == nil && a.OperationId != op:
		return false, fmt.Errorf("%v repeated on its target: operation_id %q, want the original %q", tr, a.OperationId, op)
	case err == nil:
		return true, nil
	case st.kind == "delete" && status.Code(err) != codes.FailedPrecondition:
		return true, nil
	}
	return false, fmt.Errorf("%v repeated on its target: %v", tr, err)
}

func (w *walker) get(id string) (*pb.Machine, error) {
	var m *pb.Machine
	_, err := w.s.call(nil, func(ctx context.Context, c pb.CapacityProviderClient) error {
		var err error
		m, err = c.Get(ctx, &pb.MachineRef{Id: id})
		return err
	})
	return m, err
}

// load is a set of walkers over disjoint machines.
type load struct {
	l    *ledger
	stop chan struct{}
	wg   sync.WaitGroup
}

// startLoad splits the SPECULATIVE machines among n walkers and starts
// them.
func startLoad(t testing.TB, s *replicaSet, n int, poll time.Duration) *load {
	t.Helper()
	spec := s.list(t, providertest.StSpeculative)
	if len(spec) < n {
		t.Fatalf("%d SPECULATIVE machines for %d walkers", len(spec), n)
	}
	ld := &load{l: newLedger(t), stop: make(chan struct{})}
	for i := range n {
		w := &walker{s: s, l: ld.l, shard: fmt.Sprintf("walker-%d", i), poll: poll, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(i)))}
		for j := i; j < len(spec); j += n {
			w.machines = append(w.machines, spec[j].Id)
		}
		ld.wg.Go(func() { w.run(ld.stop) })
	}
	t.Cleanup(ld.halt)
	return ld
}

// halt stops the walkers once their current transitions are done.
func (ld *load) halt() {
	select {
	case <-ld.stop:
	default:
		close(ld.stop)
	}
	ld.wg.Wait()
}

// waitProgress waits until n more transitions completed.
func (ld *load) waitProgress(t testing.TB, n int64) {
	t.Helper()
	want := ld.l.completed.Load() + n
	deadline := time.Now().Add(settleWait)
	for ld.l.completed.Load() < want {
		if t.Failed() {
			t.FailNow()
		}
		if time.Now().After(deadline) {
			t.Fatalf("the walkers completed %d transitions in %v, want %d more", ld.l.completed.Load(), settleWait, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// planSummary is the part of /debug/plan the checks read.
type planSummary struct {
	Summary map[string]int `json:"summary"`
	Drift   []struct {
		Kind    string `json:"kind"`
		Machine string `json:"machine"`
		VM      string `json:"vm"`
	} `json:"drift"`
}

// verify runs the final checks through the leader once the load stopped:
// nothing stays transitional, every machine's last acknowledged
// transition is reflected and keeps its operation id, stale tokens are
// still fenced, and the simulated world holds exactly the VMs the
// document wants (no leaked, duplicated or missing VM).
func verify(t *testing.T, s *replicaSet, ld *load, machines int) {
	t.Helper()
	ld.halt()
	leader := s.waitLeader(t)
	deadline := time.Now().Add(settleWait)
	for {
		busy := s.list(t, transitional...)
		if len(busy) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d machines still transitional %v after the load stopped, e.g. %s in %v", len(busy), settleWait, busy[0].Id, busy[0].State)
		}
		time.Sleep(100 * time.Millisecond)
	}
	all := s.list(t)
	if len(all) != machines {
		t.Errorf("inventory holds %d machines, want %d", len(all), machines)
	}
	byID := map[string]*pb.Machine{}
	for _, m := range all {
		if byID[m.Id] != nil {
			t.Errorf("machine %s listed twice", m.Id)
		}
		byID[m.Id] = m
	}

	l := ld.l
	l.mu.Lock()
	last := make(map[string]ack, len(l.last))
	for id, a := range l.last {
		last[id] = a
	}
	marks := make(map[string]token, len(l.mark))
	for id, k := range l.mark {
		marks[id] = k
	}
	failed := make(map[string]string, len(l.failed))
	for id, e := range l.failed {
		failed[id] = e
	}
	l.mu.Unlock()

	for id, a := range last {
		m := byID[id]
		if m == nil {
			t.Errorf("%v was acknowledged, but the machine is gone", a.tr)
			continue
		}
		if why, ok := failed[id]; ok {
			if m.State != providertest.StFailed || m.LastError != why {
				t.Errorf("machine %s ended FAILED (%q) during the load, now %v %q", id, why, m.State, m.LastError)
			}
			continue
		}
		if m.State != a.step.to {
			t.Errorf("%v (op %s) was acknowledged, but the machine is %v, not %v", a.tr, a.op, m.State, a.step.to)
			continue
		}
		var got *pb.TransitionAck
		_, err := s.call(nil, func(ctx context.Context, c pb.CapacityProviderClient) error {
			var err error
			got, err = mutate(ctx, c, a.step.kind, id, a.cluster, token{})
			return err
		})
		switch {
		case err == nil && got.OperationId != a.op:
			t.Errorf("%v repeated through the final leader: operation_id %q, want %q", a.tr, got.OperationId, a.op)
		case err != nil && (a.step.kind != "delete" || status.Code(err) == codes.FailedPrecondition):
			t.Errorf("%v repeated through the final leader: %v", a.tr, err)
		}
	}

	// Fence marks survived every fail-over: the newest acknowledged
	// token of each machine is stale, and changes nothing.
	for id, k := range marks {
		before := s.get(t, id)
		_, err := s.call(nil, func(ctx context.Context, c pb.CapacityProviderClient) error {
			_, err := mutate(ctx, c, "create", id, "", k)
			return err
		})
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("machine %s: token %+v, acknowledged before, answered %v; want FailedPrecondition", id, k, err)
		}
		if diff := cmp.Diff(before, s.get(t, id), protocmp.Transform()); diff != "" {
			t.Errorf("machine %s: a fenced Create changed it (-before +after):\n%s", id, diff)
		}
	}

	// The world matches the document: /debug/plan on the leader shows no
	// drift (no leaked, orphaned or missing VM) and nothing to do.
	var p planSummary
	for end := time.Now().Add(settleWait); ; time.Sleep(200 * time.Millisecond) {
		code, body := s.reps[leader].HTTPGet("/debug/plan")
		if code == 200 {
			p = planSummary{}
			if err := json.Unmarshal([]byte(body), &p); err != nil {
				t.Fatalf("decode /debug/plan: %v", err)
			}
			if p.Summary["steps"] == 0 && len(p.Drift) == 0 {
				break
			}
		}
		if time.Now().After(end) {
			t.Errorf("the world never matched the document: /debug/plan %d, summary %v, drift %+v", code, p.Summary, p.Drift)
			break
		}
	}
	l.mu.Lock()
	t.Logf("load: %d acknowledged mutations, %d transitions completed, %d attempts with unknown outcome sent again, %d applied without an ack, %d machines FAILED (documented: %v)",
		len(l.ackTimes), l.completed.Load(), l.unknown.Load(), l.unacked, len(l.failed), failureCounts(l.failed))
	l.mu.Unlock()
}

func failureCounts(failed map[string]string) map[string]int {
	out := map[string]int{}
	for _, e := range failed {
		for _, d := range documentedFailures {
			if strings.Contains(e, d) {
				out[d]++
			}
		}
	}
	return out
}

// dist renders a distribution of durations: n, min, p50, p90, max.
func dist(d []time.Duration) string {
	if len(d) == 0 {
		return "no samples"
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	q := func(p float64) time.Duration { return s[int(float64(len(s)-1)*p)].Round(time.Millisecond) }
	return fmt.Sprintf("n=%d min=%v p50=%v p90=%v max=%v", len(s), q(0), q(0.5), q(0.9), q(1))
}
