package server

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/etcdstore"
	"github.com/bigfleet-vm/provider/retry"
)

// replica is this process as one of several that share an etcd state:
// it campaigns, builds a term and acts while it leads, and stands by
// otherwise, answering every RPC with UNAVAILABLE naming the leader.
//
// Invariants: a term exists only inside an etcd term (Term); every write
// the term makes is guarded by it (etcdstore); the moment it ends the term
// is aborted (its executor and loop stop) before anything else happens,
// and nothing this replica serves reads it again.
type replica struct {
	client  *clientv3.Client
	elector *etcdstore.Elector
	self    string                 // this replica's identity
	leader  atomic.Pointer[string] // the leader's identity, "" while none
	follow  *follower
	// warm is this replica's copy of the document while it stands by: a
	// new term starts from it instead of loading the state.
	warm *etcdstore.Follower
	// slots are the offerings the copy is indexed against.
	slots []desired.Slot
	// trouble says why the last attempt to lead failed, nil once a term
	// opened; /readyz reports it.
	trouble atomic.Pointer[trouble]
}

// trouble is a failed attempt to lead and the wait before the next one.
type trouble struct {
	what     string // "campaign" or "open the state"
	err      error
	attempts int
	wait     time.Duration
	at       time.Time
}

// String is how /readyz reports it.
func (t *trouble) String() string {
	return fmt.Sprintf("cannot %s (%d attempts in a row; the last at %s, the next after %s): %v",
		t.what, t.attempts, t.at.UTC().Format(time.RFC3339), t.wait.Round(10*time.Millisecond), t.err)
}

// failed records a failed attempt and returns how long to wait before the
// next one.
func (r *replica) failed(what string, err error, b *retry.Backoff) time.Duration {
	wait := b.Next()
	n := 1
	if last := r.trouble.Load(); last != nil {
		n = last.attempts + 1
	}
	r.trouble.Store(&trouble{what: what, err: err, attempts: n, wait: wait, at: time.Now()})
	return wait
}

// newReplica connects to the cluster and prepares the campaign.
func (p *Provider) newReplica(ctx context.Context) (*replica, error) {
	e := p.cfg.Etcd
	client, err := etcdstore.NewClient(ctx, e.Client())
	if err != nil {
		return nil, fmt.Errorf("--state %s: %w", p.cfg.StatePath, err)
	}
	elector, err := etcdstore.NewElector(client, e.Prefix, e.Identity, etcdstore.ElectionOptions{TTL: e.LeaseTTL, Logger: p.log})
	if err != nil {
		client.Close()
		return nil, err
	}
	slots := desiredSlots(p.cfg)
	warm, err := etcdstore.NewFollower(client, e.Prefix, etcdstore.FollowOptions{Logger: p.log,
		Index: func() etcdstore.Index { return desired.NewWarm(slots) }})
	if err != nil {
		client.Close()
		return nil, err
	}
	follow := newFollower(client, e.Prefix)
	follow.warm = func() (int64, error) {
		st := warm.Status()
		return st.Revision, st.Err
	}
	return &replica{client: client, elector: elector, self: e.Identity, follow: follow, warm: warm, slots: slots}, nil
}

// standBy starts following the document (the warm copy) until the
// returned function is called, which stops it and waits for it.
func (r *replica) standBy(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.warm.Run(ctx)
	}()
	return func() {
		cancel()
		r.warm.Stop()
		<-done
	}
}

// standbyError is what a standby answers every RPC with. It never names
// this replica: the last leader Observe saw may be this replica itself,
// which just stepped down and, while etcd cannot be read (quorum lost),
// stays the last value seen.
func (r *replica) standbyError() error {
	leader := ""
	if l := r.leader.Load(); l != nil {
		leader = *l
	}
	if leader == "" || leader == r.self {
		return &desired.Error{Code: desired.CodeUnavailable, Msg: "this replica is a standby and no leader is elected yet; retry shortly"}
	}
	return &desired.Error{Code: desired.CodeUnavailable, Msg: fmt.Sprintf("this replica is a standby; the leader is %s", desired.Clip(leader, 256))}
}

// lead runs the replica until ctx ends: standby, campaign, lead a term
// until it ends, and again. On ctx's end a leader finishes its queued
// work within the shutdown grace (refusing mutations meanwhile) and
// resigns, so a standby takes over without waiting for the lease.
func (p *Provider) lead(ctx context.Context, hs *health.Server, serving *atomic.Bool) {
	r, cfg, log := p.ha, p.cfg, p.log
	go r.follow.run(ctx)
	go r.elector.Observe(ctx, func(id string) {
		r.leader.Store(&id)
		log.Info("leader", "identity", id)
	})
	// One schedule for every way of failing to lead: winning an election
	// does not reset it, only a term that opened does, so a replica that
	// cannot open the state backs off instead of re-electing itself.
	backoff := retry.Takeover.Backoff()
	var stopWarm func()
	defer func() {
		if stopWarm != nil {
			stopWarm()
		}
	}()
	for ctx.Err() == nil {
		setServing(hs, serving, false)
		if stopWarm == nil {
			stopWarm = r.standBy(ctx)
		}
		log.Info("standing by: campaigning for leadership", "identity", r.elector.Identity())
		tm, err := r.elector.Campaign(ctx)
		if err != nil {
			if ctx.Err() == nil {
				wait := r.failed("campaign", err, backoff)
				log.Warn("campaign failed; trying again", "err", err, "wait", wait)
				_ = retry.Sleep(ctx, wait)
			}
			continue
		}
		started := time.Now()
		t, err := p.openLeaderTerm(tm)
		// The copy went to the term (or is no longer needed): a leader
		// follows nothing; the next standby period loads afresh.
		stopWarm()
		stopWarm = nil
		if err != nil {
			wait := r.failed("open the state", err, backoff)
			log.Error("elected, but the state cannot be opened; resigning", "err", err, "wait", wait)
			resign(tm)
			_ = retry.Sleep(ctx, wait)
			continue
		}
		backoff.Reset()
		r.trouble.Store(nil)
		p.setTerm(t)
		t.start()
		setServing(hs, serving, true)
		t.laps.lap("start")
		log.Info("leading: serving the desired state", "machines", t.doc.Len(), "took", time.Since(started).Round(time.Millisecond), "parts", t.laps.String())
		select {
		case <-tm.Done():
			// Stop acting at once: the next leader owns the state now.
			p.setTerm(nil)
			setServing(hs, serving, false)
			log.Warn("leadership lost: stopping the executor and the reconcile loop", "err", tm.Err())
			t.abort("this replica lost its leadership")
			if err := t.close(); err != nil {
				log.Warn("closing the lost term", "err", err)
			}
		case <-ctx.Done():
			setServing(hs, serving, false)
			t.drain(cfg.ShutdownGrace, "the provider is shutting down")
			p.setTerm(nil)
			if err := t.close(); err != nil {
				log.Warn("closing the term", "err", err)
			}
			resign(tm)
		}
	}
}

// openLeaderTerm opens the etcd store of a new leadership term and builds
// the term from it, re-driving interrupted work exactly as after a
// restart.
func (p *Provider) openLeaderTerm(tm *etcdstore.Term) (*term, error) {
	ctx := tm.Context()
	started := time.Now()
	store, err := etcdstore.Open(ctx, p.ha.client, p.cfg.Etcd.Prefix, tm, etcdstore.Options{Logger: p.log,
		Warm:     p.ha.warm.Take,
		OnCommit: func(ops, bytes int, took time.Duration) { p.Metrics.Commit(ops, bytes, took) }})
	if err != nil {
		return nil, err
	}
	opened := time.Since(started)
	t, err := openTerm(ctx, p.cfg, p.log, p.Metrics, journaled{store}, tm.Err, &standbyCopy{slots: p.ha.slots, take: func() *desired.Warm {
		w, _ := store.Index().(*desired.Warm)
		return w
	}})
	if err != nil {
		return nil, err
	}
	t.laps.parts = append([]string{"store=" + opened.Round(100*time.Microsecond).String()}, t.laps.parts...)
	if err := tm.Err(); err != nil {
		t.close()
		return nil, fmt.Errorf("the term ended while the state was loading: %w", err)
	}
	return t, nil
}

func resign(tm *etcdstore.Term) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = tm.Resign(ctx)
}

// setServing reports the replica's role on the gRPC health service and
// /readyz: SERVING only while it leads.
func setServing(hs *health.Server, serving *atomic.Bool, on bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if on {
		st = healthpb.HealthCheckResponse_SERVING
	}
	serving.Store(on)
	hs.SetServingStatus("", st)
	hs.SetServingStatus(pb.CapacityProvider_ServiceDesc.ServiceName, st)
}
