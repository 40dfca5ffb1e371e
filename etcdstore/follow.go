package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
)

// Follower defaults.
const (
	// DefaultFollowRetry is the longest wait between two attempts to load
	// and watch again after the watch broke or a load failed.
	DefaultFollowRetry = 2 * time.Second
)

// ErrNotCurrent is what Take returns when the copy did not reach the
// revision asked for in time (or there is no copy): the caller loads the
// document itself.
var ErrNotCurrent = errors.New("the standby's copy of the state is not current")

// FollowOptions tune a Follower; the zero value is fine.
type FollowOptions struct {
	// LoadPageSize is how many keys a load reads per request. Zero means
	// DefaultLoadPageSize.
	LoadPageSize int
	// Retry is the longest wait between attempts after a failure. Zero
	// means DefaultFollowRetry.
	Retry time.Duration
	// Logger receives reloads and failures; nil discards them.
	Logger *slog.Logger
	// Index, when set, makes a fresh index for each load of the copy;
	// Take hands it over with the copy, so a new term need not decode or
	// index the document itself.
	Index func() Index
}

// Index is kept current with a follower's copy: it is given every value
// of a load, then every change in commit order, under the follower's
// lock (so each call must be quick: no I/O).
type Index interface {
	Put(key string, value []byte)
	Delete(key string)
	// Settle ends a consistent cut: a whole load (its values come in no
	// particular order), or one watch response (whole txns).
	Settle()
}

// Copy is a follower's copy of the document, handed over by Take.
type Copy struct {
	// Values are the key/value pairs under the prefix's state directory,
	// keys without it.
	Values map[string][]byte
	// Index is FollowOptions.Index's, kept with exactly Values (nil
	// without one).
	Index Index
	// Revision is the revision the copy is current at.
	Revision int64
}

// Follower keeps one current copy of the document's key/value pairs under
// a prefix, the way a warm standby does: one consistent load, then a
// watch from the revision after it, applying every event to the copy as
// it comes. A watch that etcd compacted past, cancelled or closed is
// dropped and the copy loaded again. It holds the copy and nothing else:
// events are applied as they arrive (a map assignment each), never queued.
//
// Take hands the copy over to a new leader once it is current at a given
// revision; the follower forgets it and Run returns.
type Follower struct {
	client *clientv3.Client
	root   string // prefix + "/": what the watch follows
	state  string
	page   int64
	retry  time.Duration
	log    *slog.Logger
	index  func() Index

	mu      sync.Mutex
	advance chan struct{} // closed (and replaced) whenever rev moves
	doc     map[string][]byte
	idx     Index // kept with doc, when FollowOptions.Index is set
	bytes   int64 // len(key)+len(value) over doc
	rev     int64 // the revision doc is current at; 0 while there is none
	taken   bool
	loads   int   // full loads so far
	err     error // why the last load or watch ended
}

// NewFollower prepares a follower of the document under prefix; Run
// starts it.
func NewFollower(client *clientv3.Client, prefix string, opts FollowOptions) (*Follower, error) {
	if client == nil {
		return nil, errors.New("follow etcd state: nil client")
	}
	if err := checkPrefix(prefix); err != nil {
		return nil, fmt.Errorf("follow etcd state: %w", err)
	}
	if opts.LoadPageSize <= 0 {
		opts.LoadPageSize = DefaultLoadPageSize
	}
	if opts.Retry <= 0 {
		opts.Retry = DefaultFollowRetry
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Follower{client: client, root: prefix + "/", state: prefix + stateDir, page: int64(opts.LoadPageSize),
		retry: opts.Retry, log: log, index: opts.Index, advance: make(chan struct{})}, nil
}

// Run follows the state until ctx ends or Take took the copy. A follower
// whose copy was taken can Run again: it starts from a fresh load.
func (f *Follower) Run(ctx context.Context) {
	f.mu.Lock()
	f.taken = false
	f.mu.Unlock()
	wait := 50 * time.Millisecond
	for ctx.Err() == nil {
		loaded, err := f.follow(ctx)
		if f.isTaken() || ctx.Err() != nil {
			return
		}
		f.mu.Lock()
		f.err = err
		f.mu.Unlock()
		if loaded {
			wait = 50 * time.Millisecond
		}
		f.log.Warn("following the etcd state: the watch ended; loading the state again", "err", err, "wait", wait)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, f.retry)
	}
}

// follow loads the state once and applies the watch from the revision
// after the load until the watch ends; it says whether the load worked.
func (f *Follower) follow(ctx context.Context) (bool, error) {
	var rev int64
	first := func(ctx context.Context, get clientv3.Op) (*pb.RangeResponse, int64, error) {
		g, err := f.client.Do(ctx, get)
		if err != nil {
			return nil, 0, err
		}
		rev = g.Get().Header.Revision
		return (*pb.RangeResponse)(g.Get()), rev, nil
	}
	m, err := readRetrying(func() (map[string][]byte, error) {
		return readCut(ctx, f.client, f.state, f.page, first)
	}, nil)
	if err != nil {
		return false, fmt.Errorf("load %s: %w", f.state, err)
	}
	if !f.install(m, rev) {
		return true, nil
	}
	wctx, cancel := context.WithCancel(followStream(ctx))
	defer cancel()
	// The whole prefix, not only the document: the writer key's events
	// (every leader's first write and every txn) move the copy's revision
	// too, so a new leader's claim (Store.Open) vouches for the copy
	// without any progress report.
	for wr := range f.client.Watch(wctx, f.root, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		if err := wr.Err(); err != nil {
			return true, fmt.Errorf("watch %s from revision %d: %w", f.state, f.revision()+1, err)
		}
		if wr.Canceled {
			return true, fmt.Errorf("watch %s from revision %d: cancelled by etcd: %s", f.state, f.revision()+1, wr.CancelReason)
		}
		if !f.apply(wr) {
			return true, nil
		}
	}
	return true, fmt.Errorf("watch %s from revision %d: closed", f.state, f.revision()+1)
}

// install makes m, read at rev, the copy; false once it was taken.
func (f *Follower) install(m map[string][]byte, rev int64) bool {
	var n int64
	var idx Index
	if f.index != nil {
		idx = f.index()
	}
	for k, v := range m {
		n += int64(len(k) + len(v))
		if idx != nil {
			idx.Put(k, v)
		}
	}
	if idx != nil {
		idx.Settle()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.taken {
		return false
	}
	f.doc, f.idx, f.bytes, f.loads, f.err = m, idx, n, f.loads+1, nil
	f.moveLocked(rev)
	f.log.Info("following the etcd state", "keys", len(m), "revision", rev)
	return true
}

// apply applies one watch response to the copy; false once it was taken.
// Events of one revision arrive together, so after the events the copy is
// current at the last one's revision; a response without events (a
// progress report) changes nothing.
func (f *Follower) apply(wr clientv3.WatchResponse) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.taken || f.doc == nil {
		return false
	}
	if len(wr.Events) == 0 {
		// A progress report (not asked for; never trusted: etcd before
		// 3.4.25 and 3.5.8 may send one ahead of events, etcd issue
		// 15220) moves nothing.
		return true
	}
	for _, ev := range wr.Events {
		if !strings.HasPrefix(string(ev.Kv.Key), f.state) {
			continue // the writer or election keys: they only move the revision
		}
		k := string(ev.Kv.Key[len(f.state):])
		if old, ok := f.doc[k]; ok {
			f.bytes -= int64(len(k) + len(old))
		}
		if ev.Type == mvccpb.DELETE {
			delete(f.doc, k)
			if f.idx != nil {
				f.idx.Delete(k)
			}
			continue
		}
		f.doc[k] = ev.Kv.Value
		if f.idx != nil {
			f.idx.Put(k, ev.Kv.Value)
		}
		f.bytes += int64(len(k) + len(ev.Kv.Value))
	}
	if f.idx != nil {
		f.idx.Settle()
	}
	f.moveLocked(wr.Events[len(wr.Events)-1].Kv.ModRevision)
	return true
}

func (f *Follower) moveLocked(rev int64) {
	if rev <= f.rev {
		return
	}
	f.rev = rev
	close(f.advance)
	f.advance = make(chan struct{})
}

func (f *Follower) isTaken() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.taken
}

func (f *Follower) revision() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rev
}

// Status is what the follower holds: the revision its copy is current at
// (0: none), the copy's keys and bytes, how many full loads it made and
// why the last load or watch failed (nil while it follows).
type Status struct {
	Revision   int64
	Keys       int
	Bytes      int64
	Loads      int
	Err        error
	HasCurrent bool
}

// Status reports what the follower holds now.
func (f *Follower) Status() Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return Status{Revision: f.rev, Keys: len(f.doc), Bytes: f.bytes, Loads: f.loads, Err: f.err, HasCurrent: f.doc != nil}
}

// followStream gives the follower's watch a gRPC stream of its own (the
// client shares one per distinct metadata) that requires an etcd leader,
// so a member that lost its leader cancels the watch and the copy is
// loaded again.
func followStream(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(clientv3.WithRequireLeader(ctx), "bigfleet-watch", "follow")
}

// Take waits until the copy is current at rev or later and hands it over:
// the follower forgets it and Run returns. Only an event at rev or later
// vouches for that (the watch delivers events in order), so rev must be
// the revision of a write under the prefix (a new leader's claim of the
// writer key, Store.Open). A copy current at rev holds every key as of
// rev; the caller must know that nothing else writes the prefix after
// rev (a new leader: the old one's writes are fenced). It fails with
// ErrNotCurrent when ctx ends first.
func (f *Follower) Take(ctx context.Context, rev int64) (Copy, error) {
	for {
		f.mu.Lock()
		if f.doc != nil && !f.taken && f.rev >= rev {
			c := Copy{Values: f.doc, Index: f.idx, Revision: f.rev}
			f.doc, f.idx, f.bytes, f.rev, f.taken = nil, nil, 0, 0, true
			f.mu.Unlock()
			return c, nil
		}
		have, advance := f.rev, f.advance
		f.mu.Unlock()
		select {
		case <-advance:
		case <-ctx.Done():
			return Copy{}, fmt.Errorf("%w: at revision %d, revision %d needed: %w", ErrNotCurrent, have, rev, context.Cause(ctx))
		}
	}
}

// Stop forgets the copy, so a Run in progress returns, without handing it
// to anyone (a replica that leads again reads its own document).
func (f *Follower) Stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.doc, f.idx, f.bytes, f.rev, f.taken = nil, nil, 0, 0, true
}
