package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/bigfleet-vm/provider/retry"
)

// Election defaults and caps.
const (
	// DefaultTTL is the lease TTL of a replica's election session.
	DefaultTTL = 5 * time.Second
	// MaxTTL caps ElectionOptions.TTL: a longer lease only delays takeover.
	MaxTTL = 5 * time.Minute
	// MaxIdentityBytes caps a replica's identity (the election value).
	MaxIdentityBytes = 256
	// minMargin is the smallest default safety margin.
	minMargin = 500 * time.Millisecond
	// revokeTimeout bounds the lease revoke a term makes when it ends.
	revokeTimeout = 2 * time.Second
	// renewalsPerTTL is how often a term renews its lease per TTL.
	renewalsPerTTL = 6
	// maxRenewals bounds the lease renewals in flight at once.
	maxRenewals = 4
)

var (
	// ErrNotLeader is the cause of every failure that comes from this
	// replica not (or no longer) holding the election: a term that ended,
	// a write whose guard failed. Test with errors.Is.
	ErrNotLeader = errors.New("not the leader")
	// ErrNoLeader is returned by Leader when no replica holds the election.
	ErrNoLeader = errors.New("no leader elected")
)

// ElectionOptions tune an Elector. The zero value is production-ready.
type ElectionOptions struct {
	// TTL is the session lease's time to live: how long the cluster lets a
	// silent leader keep the election. Zero means DefaultTTL. etcd leases
	// count whole seconds, so it is rounded up; etcd raises values below
	// its minimum (1.5 election timeouts, 2 s with default settings).
	TTL time.Duration
	// Margin is how long before the lease could have expired on the
	// cluster the term ends locally, so a leader that cannot renew stops
	// acting while its lease still shuts every other replica out. Zero
	// means TTL/5, at least 500 ms; it must be under half the TTL.
	Margin time.Duration
	// Logger receives term changes; nil discards them.
	Logger *slog.Logger
}

// Elector campaigns for one replica in the election under a prefix.
type Elector struct {
	client   *clientv3.Client
	pfx      string // election key prefix, without the trailing slash
	identity string
	ttl      int64 // seconds
	margin   time.Duration
	log      *slog.Logger
}

// NewElector prepares campaigns for the replica named identity (the value
// standbys report as the leader, e.g. its advertised address and host
// name) in the election under prefix + "/election".
func NewElector(client *clientv3.Client, prefix, identity string, opts ElectionOptions) (*Elector, error) {
	if client == nil {
		return nil, errors.New("new elector: nil client")
	}
	if err := checkPrefix(prefix); err != nil {
		return nil, fmt.Errorf("new elector: %w", err)
	}
	if err := checkIdentity(identity); err != nil {
		return nil, fmt.Errorf("new elector: %w", err)
	}
	ttl := opts.TTL
	if ttl == 0 {
		ttl = DefaultTTL
	}
	if ttl < 0 || ttl > MaxTTL {
		return nil, fmt.Errorf("new elector: TTL %v is outside (0, %v]", ttl, MaxTTL)
	}
	secs := int64((ttl + time.Second - 1) / time.Second)
	margin := opts.Margin
	if margin == 0 {
		margin = max(time.Duration(secs)*time.Second/5, minMargin)
	}
	if margin < 0 || 2*margin >= time.Duration(secs)*time.Second {
		return nil, fmt.Errorf("new elector: margin %v must be positive and under half the %ds TTL", margin, secs)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Elector{
		client:   client,
		pfx:      prefix + "/election",
		identity: identity,
		ttl:      secs,
		margin:   margin,
		log:      log,
	}, nil
}

func checkPrefix(prefix string) error {
	if prefix == "" || prefix[0] != '/' || strings.HasSuffix(prefix, "/") || len(prefix) > MaxPrefixBytes {
		return fmt.Errorf("key prefix %s must start with / and not end with one, at most %d bytes (see ParseURL)", quote(prefix), MaxPrefixBytes)
	}
	return nil
}

func checkIdentity(id string) error {
	if id == "" {
		return errors.New("empty replica identity")
	}
	if len(id) > MaxIdentityBytes {
		return fmt.Errorf("replica identity is %d bytes, more than the %d allowed", len(id), MaxIdentityBytes)
	}
	if !utf8.ValidString(id) {
		return errors.New("replica identity is not valid UTF-8")
	}
	for _, r := range id {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("replica identity %s contains a non-printable character", quote(id))
		}
	}
	return nil
}

// Identity is this replica's election value.
func (e *Elector) Identity() string { return e.identity }

// Leader returns the identity of the replica that currently holds the
// election, or ErrNoLeader. It is one linearizable read.
func (e *Elector) Leader(ctx context.Context) (string, error) {
	resp, err := e.client.Get(ctx, e.pfx+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return "", fmt.Errorf("read the election leader: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return "", ErrNoLeader
	}
	return e.readIdentity(resp.Kvs[0].Value), nil
}

// UnreadableIdentity is what Leader and Observe report for a leader whose
// election value is not an identity a replica writes (a foreign writer's
// value: empty, too long, not UTF-8, non-printable): it is never echoed.
const UnreadableIdentity = "(a leader whose identity is unreadable)"

// readIdentity checks an election value read back from etcd.
func (e *Elector) readIdentity(v []byte) string {
	id := string(v)
	if err := checkIdentity(id); err != nil {
		e.log.Warn("the leader's election value is not a replica identity; not echoed", "bytes", len(v), "err", err)
		return UnreadableIdentity
	}
	return id
}

// Observe calls fn with the identity of the current leader ("" while
// there is none, UnreadableIdentity for a value no replica writes) at once
// and again whenever it changes, until ctx ends;
// a standby runs it to name the leader in its UNAVAILABLE answers. fn
// runs on Observe's goroutine. While etcd cannot be read Observe keeps
// the last value and retries; it returns ctx's error.
func (e *Elector) Observe(ctx context.Context, fn func(identity string)) error {
	last, first := "", true
	b := retry.EtcdRead.Backoff()
	for {
		resp, err := e.client.Get(ctx, e.pfx+"/", clientv3.WithFirstCreate()...)
		if err == nil {
			b.Reset()
			cur := ""
			if len(resp.Kvs) > 0 {
				cur = e.readIdentity(resp.Kvs[0].Value)
			}
			if first || cur != last {
				fn(cur)
				last, first = cur, false
			}
			wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
			for wr := range e.client.Watch(wctx, e.pfx+"/", clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
				if wr.Err() != nil || len(wr.Events) > 0 {
					break
				}
			}
			cancel()
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(b.Next()):
			}
		}
	}
}

// Campaign blocks until this replica holds the election and returns its
// term, or returns the error that stopped it (ctx ended, etcd failed, the
// session lease was lost while waiting). Callers retry with backoff; every
// attempt uses a fresh lease, and a failed one revokes its own.
//
// The term starts only after a read confirms that this replica's key is
// the oldest one under the election prefix, carrying the create revision
// Guard compares against.
func (e *Elector) Campaign(ctx context.Context) (*Term, error) {
	t, err := e.newTerm(ctx)
	if err != nil {
		return nil, err
	}
	el := concurrency.NewElection(t.session, e.pfx)
	cctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(t.ctx, cancel)
	err = el.Campaign(cctx, e.identity)
	stop()
	cancel()
	if err == nil {
		t.key, t.rev = el.Key(), el.Rev()
		t.mu.Lock()
		t.started = time.Now()
		t.mu.Unlock()
		err = t.confirm(ctx)
	}
	if err != nil {
		if lost := t.Err(); lost != nil {
			err = fmt.Errorf("%w (%v)", lost, err)
		}
		t.end(fmt.Errorf("%w: campaign failed", ErrNotLeader))
		t.wait(ctx)
		return nil, fmt.Errorf("campaign under %s: %w", e.pfx, err)
	}
	e.log.Info("leading", "lease", fmt.Sprintf("%x", int64(t.lease)), "revision", t.rev)
	return t, nil
}

// Term is one period in which this replica holds the election. It ends
// once, for good: when the session lease is lost or revoked, when the
// election key is deleted or replaced, when no keepalive has been
// acknowledged for TTL minus the margin, or on Resign. A replica that
// wants to lead again campaigns for a new term.
type Term struct {
	e       *Elector
	client  *clientv3.Client
	session *concurrency.Session
	lease   clientv3.LeaseID
	key     string
	rev     int64
	started time.Time

	ctx    context.Context
	cancel context.CancelCauseFunc

	mu         sync.Mutex
	validUntil time.Time // monotonic; the term is over past it
	timer      *time.Timer

	endOnce sync.Once
	cleaned chan struct{} // closed when the lease is revoked (or abandoned)
	loops   sync.WaitGroup
}

// newTerm grants the session lease and starts the clock that ends the
// term if the lease stops being renewed.
func (e *Elector) newTerm(ctx context.Context) (*Term, error) {
	sent := time.Now()
	g, err := e.client.Grant(ctx, e.ttl)
	if err != nil {
		return nil, fmt.Errorf("grant election lease: %w", err)
	}
	tctx, cancel := context.WithCancelCause(context.Background())
	t := &Term{
		e:          e,
		client:     e.client,
		lease:      g.ID,
		ctx:        tctx,
		cancel:     cancel,
		validUntil: sent.Add(time.Duration(g.TTL)*time.Second - e.margin),
		cleaned:    make(chan struct{}),
	}
	t.session, err = concurrency.NewSession(e.client, concurrency.WithLease(g.ID), concurrency.WithTTL(int(g.TTL)), concurrency.WithContext(tctx))
	if err != nil {
		cancel(err)
		rctx, rcancel := context.WithTimeout(context.Background(), revokeTimeout)
		e.client.Revoke(rctx, g.ID)
		rcancel()
		return nil, fmt.Errorf("start election session: %w", err)
	}
	t.mu.Lock()
	t.timer = time.AfterFunc(time.Until(t.validUntil), t.checkDeadline)
	t.mu.Unlock()
	t.loops.Add(2)
	go t.keepAlive(time.Duration(g.TTL) * time.Second / renewalsPerTTL)
	go func() {
		defer t.loops.Done()
		select {
		case <-t.session.Done():
			t.end(fmt.Errorf("%w: election session ended (lease expired or keepalive stopped)", ErrNotLeader))
		case <-t.ctx.Done():
		}
	}()
	return t, nil
}

// keepAlive renews the lease every interval and moves the local deadline
// to the time a renewal was sent plus the granted TTL, minus the margin:
// the cluster measures the TTL from when it received the request, which is
// later, so the local deadline always falls before the cluster's.
// Renewals do not wait for each other (at most maxRenewals are in
// flight), so one stuck on a member that stopped answering, or slowed by
// a busy cluster, does not delay the next.
func (t *Term) keepAlive(interval time.Duration) {
	defer t.loops.Done()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	inflight := make(chan struct{}, maxRenewals)
	var renewals sync.WaitGroup
	defer renewals.Wait()
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-tick.C:
		}
		select {
		case inflight <- struct{}{}:
		default:
			continue // maxRenewals are still waiting; the deadline decides
		}
		renewals.Go(func() {
			defer func() { <-inflight }()
			t.renew()
		})
	}
}

func (t *Term) renew() {
	t.mu.Lock()
	until := t.validUntil
	t.mu.Unlock()
	sent := time.Now()
	ctx, cancel := context.WithDeadline(t.ctx, until)
	resp, err := t.client.KeepAliveOnce(ctx, t.lease)
	cancel()
	switch {
	case err == nil:
		t.extend(sent.Add(time.Duration(resp.TTL)*time.Second - t.e.margin))
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		t.end(fmt.Errorf("%w: election lease %x expired on the cluster", ErrNotLeader, int64(t.lease)))
	case t.ctx.Err() == nil:
		t.e.log.Warn("election lease keepalive failed", "lease", fmt.Sprintf("%x", int64(t.lease)), "err", err)
	}
}

func (t *Term) extend(until time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if until.After(t.validUntil) {
		t.validUntil = until
		t.timer.Reset(time.Until(until))
	}
}

func (t *Term) checkDeadline() {
	t.mu.Lock()
	until := t.validUntil
	d := time.Until(until)
	if d > 0 {
		t.timer.Reset(d)
	}
	t.mu.Unlock()
	if d <= 0 {
		t.end(t.deadlineErr(until))
	}
}

func (t *Term) deadlineErr(until time.Time) error {
	return fmt.Errorf("%w: no lease keepalive acknowledged in time; the lease may expire on the cluster within %v of %s", ErrNotLeader, t.e.margin, until.Format(time.RFC3339Nano))
}

// confirm checks that the campaign's key is the oldest under the election
// prefix (Campaign can return after its own key expired) and starts the
// watch that ends the term when the key goes.
func (t *Term) confirm(ctx context.Context) error {
	resp, err := t.client.Get(ctx, t.e.pfx+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return fmt.Errorf("confirm leadership: %w", err)
	}
	if len(resp.Kvs) == 0 || string(resp.Kvs[0].Key) != t.key || resp.Kvs[0].CreateRevision != t.rev {
		return fmt.Errorf("%w: the election key was gone when the campaign returned", ErrNotLeader)
	}
	t.loops.Add(1)
	go t.watch(resp.Header.Revision + 1)
	return t.Err()
}

// watch ends the term when the election key is deleted or recreated. A
// broken watch is re-established after a read proves the key is still
// this term's; while etcd cannot be read the lease clock bounds the term.
func (t *Term) watch(from int64) {
	defer t.loops.Done()
	for t.ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(t.ctx))
		for wr := range t.client.Watch(wctx, t.key, clientv3.WithRev(from)) {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE || ev.Kv.CreateRevision != t.rev {
					cancel()
					t.end(fmt.Errorf("%w: election key deleted at revision %d", ErrNotLeader, ev.Kv.ModRevision))
					return
				}
			}
			from = wr.Header.Revision + 1
		}
		cancel()
		b := retry.EtcdRead.Backoff()
		for t.ctx.Err() == nil {
			gctx, gcancel := context.WithTimeout(t.ctx, time.Second)
			resp, err := t.client.Get(gctx, t.key)
			gcancel()
			if err == nil {
				if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != t.rev {
					t.end(fmt.Errorf("%w: election key no longer ours at revision %d", ErrNotLeader, resp.Header.Revision))
					return
				}
				from = resp.Header.Revision + 1
				break
			}
			select {
			case <-t.ctx.Done():
			case <-time.After(b.Next()):
			}
		}
	}
}

// end finishes the term with cause (wrapping ErrNotLeader): Done closes at
// once, keepalives stop, and the lease is revoked in the background so
// another replica can take over without waiting for the TTL.
func (t *Term) end(cause error) {
	t.endOnce.Do(func() {
		t.cancel(cause)
		t.mu.Lock()
		if t.timer != nil {
			t.timer.Stop()
		}
		started := !t.started.IsZero()
		t.mu.Unlock()
		if started {
			t.e.log.Warn("leadership ended", "lease", fmt.Sprintf("%x", int64(t.lease)), "err", cause)
		}
		go func() {
			defer close(t.cleaned)
			t.session.Orphan()
			rctx, cancel := context.WithTimeout(context.Background(), revokeTimeout)
			defer cancel()
			if _, err := t.client.Revoke(rctx, t.lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
				t.e.log.Warn("revoke election lease; it expires after its TTL", "lease", fmt.Sprintf("%x", int64(t.lease)), "err", err)
			}
			t.loops.Wait()
		}()
	})
}

// wait returns when the term's cleanup finished or ctx ended.
func (t *Term) wait(ctx context.Context) error {
	select {
	case <-t.cleaned:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Done is closed the moment the term ends. The holder must stop its
// reconcile loop and executor then and return to standby.
func (t *Term) Done() <-chan struct{} { return t.ctx.Done() }

// Context is cancelled when the term ends; context.Cause says why.
func (t *Term) Context() context.Context { return t.ctx }

// Err returns nil while the term lasts and the reason it ended (wrapping
// ErrNotLeader) after. It also checks the lease deadline itself, so a
// process that was paused past its lease learns it on the first call after
// waking, even before its timers ran. Call it right before any action that
// etcd cannot fence (a hypervisor call).
func (t *Term) Err() error {
	if t.ctx.Err() != nil {
		return context.Cause(t.ctx)
	}
	t.mu.Lock()
	until := t.validUntil
	t.mu.Unlock()
	if !time.Now().Before(until) {
		t.end(t.deadlineErr(until))
		return context.Cause(t.ctx)
	}
	return nil
}

// Guard is the comparison every write of this term carries: the election
// key still exists with this term's create revision. A txn whose guard
// fails was made by a replica that is no longer leader and changed nothing.
func (t *Term) Guard() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(t.key), "=", t.rev)
}

// Key is the term's election key; Revision its create revision.
func (t *Term) Key() string { return t.key }

// Revision is the create revision of the term's election key: it grows
// with every term, so it orders terms.
func (t *Term) Revision() int64 { return t.rev }

// Lease is the session lease that holds the election key.
func (t *Term) Lease() clientv3.LeaseID { return t.lease }

// Identity is the election value of the replica holding the term.
func (t *Term) Identity() string { return t.e.identity }

// Resign ends the term now and gives the election up: the lease (and with
// it the election key) is revoked, so a standby takes over at once. It
// returns when the revoke finished or ctx ended.
func (t *Term) Resign(ctx context.Context) error {
	t.end(fmt.Errorf("%w: resigned", ErrNotLeader))
	return t.wait(ctx)
}
