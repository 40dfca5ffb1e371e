package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/bigfleet-vm/provider/kv"
	"github.com/bigfleet-vm/provider/retry"
)

// Op is one change: a put of Value under Key, or a delete of Key.
type Op = kv.Op

// Store defaults. The limits are etcd's server defaults; raise them only
// together with the cluster's --max-txn-ops and --max-request-bytes.
const (
	DefaultMaxTxnOps       = 128
	DefaultMaxRequestBytes = 1536 * 1024 // 1.5 MiB
	DefaultTxnTimeout      = 5 * time.Second
	DefaultAttemptTimeout  = 2 * time.Second
	DefaultLoadPageSize    = 4096
	DefaultChunkParallel   = 4
	DefaultWarmWait        = time.Second
	// DefaultLinger caps the hold of a background-only queue (see
	// Options.Linger): short against any step the reconciler runs.
	DefaultLinger = 10 * time.Millisecond
	// MaxKeyBytes caps an Op's key.
	MaxKeyBytes = 4096
	// txnReserve is the part of a request kept for the compares, the
	// writer key, the Else reads and the raft request header.
	txnReserve = 8 << 10
	// opOverhead bounds the protobuf framing of one put or delete.
	opOverhead = 32
	// stateDir holds the document's keys under the prefix.
	stateDir = "/state/"
)

var (
	// ErrClosed fails batches committed after Close.
	ErrClosed = errors.New("etcd store is closed")
)

// Options tune a Store. The zero value is production-ready against an
// etcd cluster with default limits.
type Options struct {
	// MaxTxnOps is the cluster's --max-txn-ops; one op of every txn is
	// the store's own writer key. Zero means DefaultMaxTxnOps.
	MaxTxnOps int
	// MaxRequestBytes is the cluster's --max-request-bytes. Zero means
	// DefaultMaxRequestBytes.
	MaxRequestBytes int
	// TxnTimeout bounds one txn, retries included, so a cluster without
	// quorum fails the store instead of hanging. Zero means
	// DefaultTxnTimeout. The term ending cuts it short.
	TxnTimeout time.Duration
	// AttemptTimeout bounds one attempt of a txn: an attempt stuck on a
	// member that stopped serving is abandoned and the txn sent again
	// (safely, see the package documentation). Zero means
	// DefaultAttemptTimeout.
	AttemptTimeout time.Duration
	// LoadPageSize is how many keys Load reads per request. Zero means
	// DefaultLoadPageSize.
	LoadPageSize int
	// ChunkParallel is how many txns of one oversized batch (see
	// Commit) may be in flight at once. Zero means DefaultChunkParallel.
	ChunkParallel int
	// Logger receives failures; nil discards them.
	Logger *slog.Logger
	// Warm, if set, is a warm standby's copy of the document: Load takes
	// it from there once it is current at the revision Open read the
	// writer key at (after this term began, so it holds every write of
	// every earlier term), waiting at most WarmWait, and reads etcd
	// itself only when it is not (see Follower.Take).
	Warm func(ctx context.Context, rev int64) (Copy, error)
	// WarmWait bounds Load's wait for Warm. Zero means DefaultWarmWait.
	WarmWait time.Duration
	// Linger caps how long the committer holds a queue that holds only
	// background batches (CommitBackground: the reconciler's records, no
	// RPC waits on them) before writing it, so that a Commit arriving
	// meanwhile (an RPC's ack waits on it) shares their txn instead of
	// waiting behind it. The hold is the previous txn's duration (Linger
	// before the first), at most Linger: a Commit arriving within it is
	// then acknowledged no later than it would have been behind the
	// background txn. A Commit, Close or the end of the hold ends the
	// wait. Zero means DefaultLinger; negative means never.
	Linger time.Duration
	// OnCommit, if set, is called after every successful txn with the
	// number of ops and request bytes it carried and how long it took. It
	// runs on the committer goroutine and must return quickly.
	OnCommit func(ops, bytes int, took time.Duration)
}

// Store keeps the desired document's key/value pairs in etcd for one
// leadership term. See the package documentation for its invariants.
type Store struct {
	client    *clientv3.Client
	term      *Term
	prefix    string // data keys are prefix + Op.Key
	writerKey string
	opts      Options
	maxOps    int // per txn, without the writer key
	maxBytes  int // per txn, without txnReserve
	log       *slog.Logger
	stopWatch func() bool

	mu       sync.Mutex
	wake     *sync.Cond
	queue    []pending // for the committer
	late     []pending // committed after Close: they fail with ErrClosed
	err      error     // sticky
	closing  bool
	exited   bool // the committer returned; late batches go to a drainer
	draining bool // a drainer runs

	// Owned by the committer goroutine (and Load, which runs before it
	// has work).
	writerRev int64         // mod revision of writerKey after our last txn
	openRev   int64         // the revision Open read the writer key at
	seq       uint64        // txns sent in this term
	lastTook  time.Duration // how long the last successful txn took
	// A committed key's size (len(key)+len(value)) is sizes's, or else
	// the loaded value's: loaded is the document as Load read it (the
	// caller's too, never written), sizes every key committed since (0:
	// deleted). No copy of the sizes of a large document is built.
	loaded map[string][]byte
	sizes  map[string]int

	size    atomic.Int64
	stopped chan struct{}
	index   Index // Load's warm copy's index (under mu)

	// onLinger, if set (tests), is called under mu when the committer
	// starts holding a background-only queue.
	onLinger func()
}

type pending struct {
	ops  []Op
	done func(error)
	// background: CommitBackground's; the committer may hold it for
	// Options.Linger.
	background bool
}

// Open starts the store for term under prefix (data keys live under
// prefix + "/state/"). It reads the writer key through a guarded txn, so
// it fails with ErrNotLeader if the term is already over. The store never
// closes client and never ends term.
func Open(ctx context.Context, client *clientv3.Client, prefix string, term *Term, opts Options) (*Store, error) {
	if client == nil || term == nil {
		return nil, errors.New("open etcd store: nil client or term")
	}
	if err := checkPrefix(prefix); err != nil {
		return nil, fmt.Errorf("open etcd store: %w", err)
	}
	if opts.MaxTxnOps == 0 {
		opts.MaxTxnOps = DefaultMaxTxnOps
	}
	if opts.MaxRequestBytes == 0 {
		opts.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if opts.TxnTimeout == 0 {
		opts.TxnTimeout = DefaultTxnTimeout
	}
	if opts.AttemptTimeout == 0 {
		opts.AttemptTimeout = DefaultAttemptTimeout
	}
	if opts.LoadPageSize == 0 {
		opts.LoadPageSize = DefaultLoadPageSize
	}
	if opts.ChunkParallel == 0 {
		opts.ChunkParallel = DefaultChunkParallel
	}
	if opts.WarmWait == 0 {
		opts.WarmWait = DefaultWarmWait
	}
	if opts.Linger == 0 {
		opts.Linger = DefaultLinger
	}
	switch {
	case opts.MaxTxnOps < 2:
		return nil, fmt.Errorf("open etcd store: MaxTxnOps %d is below 2", opts.MaxTxnOps)
	case opts.MaxRequestBytes < 2*txnReserve:
		return nil, fmt.Errorf("open etcd store: MaxRequestBytes %d is below %d", opts.MaxRequestBytes, 2*txnReserve)
	case opts.MaxRequestBytes > clientSendLimit:
		return nil, fmt.Errorf("open etcd store: MaxRequestBytes %d is above the client's %d", opts.MaxRequestBytes, clientSendLimit)
	case opts.TxnTimeout < 0 || opts.AttemptTimeout < 0:
		return nil, fmt.Errorf("open etcd store: negative TxnTimeout %v or AttemptTimeout %v", opts.TxnTimeout, opts.AttemptTimeout)
	case opts.LoadPageSize < 1:
		return nil, fmt.Errorf("open etcd store: LoadPageSize %d is below 1", opts.LoadPageSize)
	case opts.ChunkParallel < 1:
		return nil, fmt.Errorf("open etcd store: ChunkParallel %d is below 1", opts.ChunkParallel)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{
		client:    client,
		term:      term,
		prefix:    prefix + stateDir,
		writerKey: prefix + "/writer",
		opts:      opts,
		maxOps:    opts.MaxTxnOps - 1,
		maxBytes:  opts.MaxRequestBytes - txnReserve,
		log:       log,
		sizes:     make(map[string]int),
		stopped:   make(chan struct{}),
	}
	s.wake = sync.NewCond(&s.mu)
	resp, err := client.Txn(ctx).If(term.Guard()).Then(clientv3.OpGet(s.writerKey)).Commit()
	if err != nil {
		return nil, fmt.Errorf("open etcd store: read %s: %w", s.writerKey, err)
	}
	if !resp.Succeeded {
		return nil, fmt.Errorf("open etcd store: %w: election key %s is gone", ErrNotLeader, term.Key())
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		s.writerRev = kvs[0].ModRevision
	}
	s.openRev = resp.Header.Revision
	if opts.Warm != nil {
		// The claim: the term's first write moves the writer key, so a
		// warm copy that has seen its event holds everything before it
		// (the watch delivers in order) without trusting any progress
		// report. Fenced like every txn: by the term and by the writer
		// key read above.
		claim, err := client.Txn(ctx).If(term.Guard(), clientv3.Compare(clientv3.ModRevision(s.writerKey), "=", s.writerRev)).
			Then(clientv3.OpPut(s.writerKey, fmt.Sprintf("%x/claim", int64(term.Lease())))).Commit()
		if err != nil {
			return nil, fmt.Errorf("open etcd store: claim %s: %w", s.writerKey, err)
		}
		if !claim.Succeeded {
			return nil, fmt.Errorf("open etcd store: %w: election key %s is gone, or another writer moved %s", ErrNotLeader, term.Key(), s.writerKey)
		}
		s.writerRev, s.openRev = claim.Header.Revision, claim.Header.Revision
	}
	s.stopWatch = context.AfterFunc(term.Context(), func() { s.fail(context.Cause(term.Context())) })
	go s.run()
	return s, nil
}

// Load returns every key/value pair under the store's prefix, read in
// pages at one revision; the first page is a txn guarded by the term, so
// everything the previous leader committed is included and nothing it
// could still send is. Call it once, before the first Commit.
//
// With Options.Warm it takes the standby's copy instead, once that is
// current at the revision Open read: every earlier term's writes were
// guarded by an election key deleted before this term began, so the
// document as of that revision is the document until this term writes,
// exactly what a guarded read would return.
func (s *Store) Load(ctx context.Context) (map[string][]byte, error) {
	if s.opts.Warm != nil {
		wctx, cancel := context.WithTimeout(ctx, s.opts.WarmWait)
		c, err := s.opts.Warm(wctx, s.openRev)
		cancel()
		if err == nil {
			if err := s.term.Err(); err != nil {
				return nil, fmt.Errorf("load: %w", err)
			}
			s.log.Info("state taken from the warm standby's copy", "keys", len(c.Values), "revision", c.Revision, "needed", s.openRev)
			s.adopt(c.Values)
			s.mu.Lock()
			s.index = c.Index
			s.mu.Unlock()
			return c.Values, nil
		}
		s.log.Warn("the warm standby's copy is not current; loading the state from etcd", "err", err)
	}
	guarded := func(ctx context.Context, get clientv3.Op) (*pb.RangeResponse, int64, error) {
		resp, err := s.client.Txn(ctx).If(s.term.Guard()).Then(get).Commit()
		if err != nil {
			return nil, 0, err
		}
		if !resp.Succeeded {
			return nil, 0, fmt.Errorf("%w: election key %s is gone", ErrNotLeader, s.term.Key())
		}
		return resp.Responses[0].GetResponseRange(), resp.Header.Revision, nil
	}
	m, err := readRetrying(func() (map[string][]byte, error) {
		return readCut(ctx, s.client, s.prefix, int64(s.opts.LoadPageSize), guarded)
	}, func(err error) {
		s.log.Warn("etcd compacted the revision a load was reading; reading again", "err", err)
	})
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	s.adopt(m)
	return m, nil
}

// adopt sizes the loaded document.
func (s *Store) adopt(m map[string][]byte) {
	var total int64
	for k, v := range m {
		total += int64(len(k) + len(v))
	}
	s.mu.Lock()
	s.loaded, s.sizes = m, map[string]int{}
	s.mu.Unlock()
	s.size.Store(total)
}

// sizeOf is committed key k's size and whether it exists; under mu.
func (s *Store) sizeOf(k string) (int, bool) {
	if n, ok := s.sizes[k]; ok {
		return n, n > 0
	}
	if v, ok := s.loaded[k]; ok {
		return len(k) + len(v), true
	}
	return 0, false
}

// Commit queues ops as one batch and returns without waiting. done, if
// not nil, is called exactly once, never from inside Commit, in Commit
// order, from the store's committer goroutine (batches committed after
// Close fail with ErrClosed from a drain goroutine that starts once the
// committer is done): nil once etcd committed the batch, or an
// error once the batch is not known to be committed. After the first
// failure every later batch fails too. The store keeps ops' values; the
// caller must not modify them afterwards.
func (s *Store) Commit(ops []Op, done func(error)) {
	s.commit(pending{ops: append([]Op(nil), ops...), done: done})
}

// CommitBackground is Commit for a batch no RPC's answer waits on (the
// reconciler's): the committer may hold it for Options.Linger, until a
// Commit arrives to share its txn. Order, atomicity and done are as for
// Commit.
func (s *Store) CommitBackground(ops []Op, done func(error)) {
	s.commit(pending{ops: append([]Op(nil), ops...), done: done, background: true})
}

func (s *Store) commit(p pending) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		s.late = append(s.late, p)
		s.drainLocked()
		return
	}
	s.queue = append(s.queue, p)
	s.wake.Signal()
}

// drainLocked starts a drainer for late batches once the committer has
// returned, so their done callbacks never overlap the committer's.
func (s *Store) drainLocked() {
	if s.exited && !s.draining && len(s.late) > 0 {
		s.draining = true
		go s.drainLate()
	}
}

// Healthy returns the error that stopped the store: ErrNotLeader (wrapped)
// once the term ended, or the first failed txn. It checks the term's lease
// deadline itself, so a process that slept through its lease sees the
// failure on the first call after waking.
func (s *Store) Healthy() error {
	if err := s.term.Err(); err != nil {
		s.fail(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Index hands over the index of the warm copy Load took (see
// Copy.Index), once: nil after the first call, and when Load read the
// state itself.
func (s *Store) Index() Index {
	s.mu.Lock()
	defer s.mu.Unlock()
	x := s.index
	s.index = nil
	return x
}

// Size is the number of key and value bytes the store holds: what Load
// found plus every committed change since.
func (s *Store) Size() int64 { return s.size.Load() }

// Close commits what is queued (or fails it, if the store failed) and
// stops the committer. Batches committed after Close fail with ErrClosed.
// It neither closes the client nor ends the term.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		<-s.stopped
		return nil
	}
	s.closing = true
	s.wake.Signal()
	s.mu.Unlock()
	<-s.stopped
	s.stopWatch()
	return nil
}

// fail stops the store with err and ends the term: after a txn whose
// outcome is unknown this replica's view may differ from etcd's, so it
// must step down and let a leader that reloads take over; ending the term
// also revokes the lease, which fences any attempt still in flight.
func (s *Store) fail(err error) {
	s.mu.Lock()
	first := s.err == nil
	if first {
		s.err = err
	}
	s.mu.Unlock()
	if first {
		s.log.Error("etcd store stopped", "err", err)
		s.term.end(fmt.Errorf("%w: the etcd store failed: %v", ErrNotLeader, err))
	}
}

func (s *Store) sticky() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *Store) drainLate() {
	for {
		s.mu.Lock()
		q := s.late
		s.late = nil
		if len(q) == 0 {
			s.draining = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		for _, p := range q {
			if p.done != nil {
				p.done(ErrClosed)
			}
		}
	}
}

// run is the committer: it takes every queued batch at once and writes
// them in as few txns as the limits allow, one txn in flight at a time.
func (s *Store) run() {
	defer close(s.stopped)
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !s.closing {
			s.wake.Wait()
		}
		s.lingerLocked()
		q := s.queue
		s.queue = nil
		if len(q) == 0 {
			s.exited = true
			s.drainLocked()
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		s.process(q)
	}
}

// lingerLocked holds a queue of background batches only, for the last
// txn's duration (at most Options.Linger), until a foreground batch joins
// it or the store closes.
// The queue keeps its order; only its txn waits. Called with mu held.
func (s *Store) lingerLocked() {
	if s.opts.Linger <= 0 || s.closing || !s.backgroundOnlyLocked() {
		return
	}
	hold := s.opts.Linger
	if s.lastTook > 0 {
		hold = min(hold, s.lastTook)
	}
	expired := false
	t := time.AfterFunc(hold, func() {
		s.mu.Lock()
		expired = true
		s.wake.Broadcast()
		s.mu.Unlock()
	})
	defer t.Stop()
	if s.onLinger != nil {
		s.onLinger()
	}
	for !expired && !s.closing && s.backgroundOnlyLocked() {
		s.wake.Wait()
	}
}

func (s *Store) backgroundOnlyLocked() bool {
	for _, p := range s.queue {
		if !p.background {
			return false
		}
	}
	return len(s.queue) > 0
}

// txnBuf collects the ops of one txn, one per key (last wins).
type txnBuf struct {
	ops   []Op
	index map[string]int
	bytes int
}

func (b *txnBuf) reset() {
	b.ops = b.ops[:0]
	clear(b.index)
	b.bytes = 0
}

func opBytes(prefix string, op Op) int {
	return len(prefix) + len(op.Key) + len(op.Value) + opOverhead
}

// fits reports whether ops can join the txn: the keys it does not hold
// yet stay within maxOps and the bytes (counted as if nothing were
// replaced) within maxBytes.
func (s *Store) fits(b *txnBuf, ops []Op) bool {
	n, bytes := len(b.ops), b.bytes
	for _, op := range ops {
		if _, ok := b.index[op.Key]; !ok {
			n++
		}
		bytes += opBytes(s.prefix, op)
	}
	return n <= s.maxOps && bytes <= s.maxBytes
}

func (s *Store) add(b *txnBuf, op Op) {
	if i, ok := b.index[op.Key]; ok {
		b.bytes -= opBytes(s.prefix, b.ops[i])
		b.ops[i] = op
	} else {
		b.index[op.Key] = len(b.ops)
		b.ops = append(b.ops, op)
	}
	b.bytes += opBytes(s.prefix, op)
}

// dedupe keeps the last op of every key, in the order keys first appear.
func dedupe(ops []Op) []Op {
	if len(ops) < 2 {
		return ops
	}
	idx := make(map[string]int, len(ops))
	out := make([]Op, 0, len(ops))
	for _, op := range ops {
		if i, ok := idx[op.Key]; ok {
			out[i] = op
			continue
		}
		idx[op.Key] = len(out)
		out = append(out, op)
	}
	return out
}

func (s *Store) checkOp(op Op) error {
	switch {
	case op.Key == "":
		return errors.New("commit: empty key")
	case len(op.Key) > MaxKeyBytes:
		return fmt.Errorf("commit: key %s is %d bytes, more than the %d allowed", quote(op.Key), len(op.Key), MaxKeyBytes)
	case opBytes(s.prefix, op) > s.maxBytes:
		return fmt.Errorf("commit: value of key %s is %d bytes; one etcd request carries at most %d (--max-request-bytes %d)", quote(op.Key), len(op.Value), s.maxBytes, s.opts.MaxRequestBytes)
	}
	return nil
}

// process writes batches in order. Batches that fit together share a txn;
// a batch that fits no txn alone is split across consecutive txns. A
// batch's done runs after the txn holding its last op succeeded.
func (s *Store) process(q []pending) {
	buf := &txnBuf{index: make(map[string]int)}
	var waiting []pending
	for _, p := range q {
		ops := dedupe(p.ops)
		var bad error
		for _, op := range ops {
			if bad = s.checkOp(op); bad != nil {
				break
			}
		}
		if bad != nil {
			s.flush(buf, waiting)
			waiting = nil
			s.fail(bad)
			s.finish([]pending{p}, bad)
			continue
		}
		if s.fits(buf, ops) {
			for _, op := range ops {
				s.add(buf, op)
			}
			waiting = append(waiting, p)
			continue
		}
		s.flush(buf, waiting)
		waiting = nil
		if !s.fits(buf, ops) {
			chunks := s.split(ops)
			s.sendChunks(chunks[:len(chunks)-1])
			ops = chunks[len(chunks)-1]
		}
		for _, op := range ops {
			s.add(buf, op)
		}
		waiting = append(waiting, p)
	}
	s.flush(buf, waiting)
}

// split cuts deduplicated ops into runs that each fit one txn.
func (s *Store) split(ops []Op) [][]Op {
	var chunks [][]Op
	start, n, bytes := 0, 0, 0
	for i, op := range ops {
		b := opBytes(s.prefix, op)
		if n+1 > s.maxOps || bytes+b > s.maxBytes {
			chunks = append(chunks, ops[start:i])
			start, n, bytes = i, 0, 0
		}
		n++
		bytes += b
	}
	return append(chunks, ops[start:])
}

type chunkResult struct {
	ops, bytes int
	took       time.Duration
}

// sendChunks writes all but the last chunk of an oversized batch,
// ChunkParallel txns at a time; the last chunk goes with the txn that
// follows, which moves the writer key. Chunk txns compare the writer key's
// mod revision but do not move it, so they apply in any order, and a
// chunk applied twice (a retry) leaves what one application leaves since
// the keys of one batch are distinct; once the following txn moved the
// writer key, no late chunk attempt can apply.
func (s *Store) sendChunks(chunks [][]Op) {
	if len(chunks) == 0 || s.sticky() != nil {
		return
	}
	sem := make(chan struct{}, s.opts.ChunkParallel)
	results := make([]chunkResult, len(chunks))
	var wg sync.WaitGroup
	for i, ops := range chunks {
		if s.sticky() != nil {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			start := time.Now()
			bytes, err := s.sendChunk(ops)
			if err != nil {
				s.fail(err)
				return
			}
			s.account(ops)
			results[i] = chunkResult{ops: len(ops), bytes: bytes, took: time.Since(start)}
		})
	}
	wg.Wait()
	if s.opts.OnCommit != nil {
		for _, r := range results {
			if r.ops > 0 {
				s.opts.OnCommit(r.ops, r.bytes, r.took)
			}
		}
	}
}

// sendChunk writes one chunk guarded by the term and the writer key's
// current mod revision, retrying like send.
func (s *Store) sendChunk(ops []Op) (int, error) {
	then := make([]clientv3.Op, 0, len(ops))
	bytes := 0
	for _, op := range ops {
		bytes += opBytes(s.prefix, op)
		if op.Delete {
			then = append(then, clientv3.OpDelete(s.prefix+op.Key))
		} else {
			then = append(then, clientv3.OpPut(s.prefix+op.Key, string(op.Value)))
		}
	}
	rev := s.writerRev
	resp, err := s.retry(len(ops), func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return s.client.Txn(ctx).
			If(s.term.Guard(), clientv3.Compare(clientv3.ModRevision(s.writerKey), "=", rev)).
			Then(then...).
			Else(clientv3.OpGet(s.term.Key())).
			Commit()
	})
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		election := resp.Responses[0].GetResponseRange().Kvs
		if len(election) == 0 || election[0].CreateRevision != s.term.Revision() {
			return 0, fmt.Errorf("commit %d ops: %w: the election key was gone at revision %d", len(ops), ErrNotLeader, resp.Header.Revision)
		}
		return 0, fmt.Errorf("commit %d ops: %s was changed behind this leader's back (expected revision %d)", len(ops), s.writerKey, rev)
	}
	return bytes, nil
}

// flush sends the txn in buf (if any) and then settles waiting.
func (s *Store) flush(buf *txnBuf, waiting []pending) {
	err := s.sticky()
	if err == nil && len(buf.ops) > 0 {
		if err = s.send(buf); err != nil {
			s.fail(err)
		}
	}
	buf.reset()
	if err != nil {
		err = s.sticky()
	}
	s.finish(waiting, err)
}

func (s *Store) finish(ps []pending, err error) {
	for _, p := range ps {
		if p.done != nil {
			p.done(err)
		}
	}
}

// send writes one txn guarded by the term and by the writer key's mod
// revision, and moves the writer key. The writer compare makes a retry,
// or a delayed earlier attempt, apply at most once and never after a
// later txn, and the Else branch tells a retry whether an earlier attempt
// already applied.
func (s *Store) send(buf *txnBuf) error {
	start := time.Now()
	s.seq++
	id := fmt.Sprintf("%x/%d", int64(s.term.Lease()), s.seq)
	then := make([]clientv3.Op, 0, len(buf.ops)+1)
	for _, op := range buf.ops {
		if op.Delete {
			then = append(then, clientv3.OpDelete(s.prefix+op.Key))
		} else {
			then = append(then, clientv3.OpPut(s.prefix+op.Key, string(op.Value)))
		}
	}
	then = append(then, clientv3.OpPut(s.writerKey, id))
	resp, err := s.retry(len(buf.ops), func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return s.client.Txn(ctx).
			If(s.term.Guard(), clientv3.Compare(clientv3.ModRevision(s.writerKey), "=", s.writerRev)).
			Then(then...).
			Else(clientv3.OpGet(s.writerKey), clientv3.OpGet(s.term.Key())).
			Commit()
	})
	if err != nil {
		return err
	}
	if resp.Succeeded {
		s.committed(buf, resp.Header.Revision, start)
		return nil
	}
	return s.refused(buf, resp, id, start)
}

// retry runs txn until it returns a response, retrying Unavailable errors
// (a member down, an etcd leader change, a server-side timeout) and
// attempts that outlive AttemptTimeout, for at most TxnTimeout and only
// while the term lasts. Callers make their txns safe to apply twice.
func (s *Store) retry(n int, txn func(context.Context) (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(s.term.Context()), s.opts.TxnTimeout)
	defer cancel()
	attempt := 0
	p := retry.EtcdTxn
	p.Before = func() error {
		if err := s.term.Err(); err != nil {
			if attempt > 0 {
				return fmt.Errorf("commit %d ops (outcome unknown): %w", n, err)
			}
			return fmt.Errorf("commit %d ops: %w", n, err)
		}
		return nil
	}
	var final error // an error no retry may follow, already worded
	resp, err := retry.Value(ctx, p, func(error) bool { return final == nil }, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		attempt++
		actx, acancel := context.WithTimeout(ctx, s.opts.AttemptTimeout)
		resp, err := txn(actx)
		timedOut := actx.Err() != nil && ctx.Err() == nil
		acancel()
		if err == nil {
			return resp, nil
		}
		if cause := context.Cause(s.term.Context()); cause != nil {
			final = fmt.Errorf("commit %d ops: leadership ended with the txn in flight, outcome unknown: %w", n, cause)
			return nil, final
		}
		if ctx.Err() != nil || !(timedOut || retryable(err)) {
			final = fmt.Errorf("commit %d ops (attempt %d, %v after the first; outcome unknown): %w", n, attempt, time.Since(start).Round(time.Millisecond), err)
			return nil, final
		}
		s.log.Debug("etcd txn failed; retrying", "err", err)
		return nil, err
	})
	if err != nil && final == nil && retry.Last(err) != nil {
		// The wait between two attempts ended: the term or TxnTimeout.
		if terr := p.Before(); terr != nil {
			return nil, terr
		}
		return nil, fmt.Errorf("commit %d ops (attempt %d, %v after the first; outcome unknown): %w", n, attempt, time.Since(start).Round(time.Millisecond), err)
	}
	return resp, err
}

// refused explains a txn whose compares failed: an earlier attempt of the
// same txn already applied (success), the term is over (ErrNotLeader), or
// someone else wrote the writer key.
func (s *Store) refused(buf *txnBuf, resp *clientv3.TxnResponse, id string, start time.Time) error {
	writer := resp.Responses[0].GetResponseRange().Kvs
	if len(writer) == 1 && string(writer[0].Value) == id {
		s.committed(buf, writer[0].ModRevision, start)
		return nil
	}
	election := resp.Responses[1].GetResponseRange().Kvs
	if len(election) == 0 || election[0].CreateRevision != s.term.Revision() {
		return fmt.Errorf("commit %d ops: %w: the election key was gone at revision %d", len(buf.ops), ErrNotLeader, resp.Header.Revision)
	}
	var got string
	if len(writer) == 1 {
		got = string(writer[0].Value)
	}
	return fmt.Errorf("commit %d ops: %s was changed behind this leader's back (now %s at revision %d, expected revision %d)", len(buf.ops), s.writerKey, quote(got), resp.Header.Revision, s.writerRev)
}

func (s *Store) committed(buf *txnBuf, rev int64, start time.Time) {
	s.writerRev = rev
	s.lastTook = time.Since(start)
	s.account(buf.ops)
	if s.opts.OnCommit != nil {
		s.opts.OnCommit(len(buf.ops), buf.bytes, time.Since(start))
	}
}

// account adds committed ops to Size.
func (s *Store) account(ops []Op) {
	var delta int64
	s.mu.Lock()
	for _, op := range ops {
		old, had := s.sizeOf(op.Key)
		if had {
			delta -= int64(old)
		}
		if op.Delete {
			if _, ok := s.loaded[op.Key]; ok {
				s.sizes[op.Key] = 0
			} else {
				delete(s.sizes, op.Key)
			}
			continue
		}
		n := len(op.Key) + len(op.Value)
		s.sizes[op.Key] = n
		delta += int64(n)
	}
	s.mu.Unlock()
	s.size.Add(delta)
}

// retryable reports whether err is one etcd reports for a request that
// may succeed when sent again: Unavailable (no leader, leader changed, a
// server timeout, a closing connection) or Unknown (an unmapped server
// error such as "raft: stopped" from a member that is going down). Every
// txn the store sends is safe to apply twice, so an error that leaves the
// outcome open is retried rather than failing the store; requests etcd
// refuses for good (too large, too many ops, no space, permission) carry
// other codes and are not.
func retryable(err error) bool {
	var code codes.Code
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		code = ee.Code()
	} else if st, ok := status.FromError(err); ok {
		code = st.Code()
	} else {
		return false
	}
	return code == codes.Unavailable || code == codes.Unknown
}
