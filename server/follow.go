package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/bigfleet-vm/provider/retry"
)

// How a replica of an etcd state confirms it can follow the committed
// state: a linearizable read (which needs a quorum) every followEvery,
// each bounded by followTimeout; after followStale without one the state
// is reported unhealthy (state_healthy 0 on a standby).
const (
	followEvery   = 2 * time.Second
	followTimeout = 2 * time.Second
	followStale   = 10 * time.Second
)

// maxHeads bounds the heads a warm standby remembers until its copy
// reaches them (followEvery apart: the last 32 s).
const maxHeads = 16

// follower is how a replica of an etcd state knows it could take over:
// it reads the store's head (the writer key, one small linearizable read)
// every followEvery. Its lag is what state_follow_lag_seconds reports,
// and on a standby what state_healthy and /readyz check.
//
// A warm standby (warm set: the revision its copy of the document is
// current at) counts a head as reached only once its copy is current at
// the head's revision, the writer key's last write (which the copy's
// watch sees too, so an idle state confirms without a progress report):
// its lag is the age of the newest head its copy has reached. Without
// warm, the lag is the age of the last successful read.
type follower struct {
	client *clientv3.Client
	key    string
	now    func() time.Time
	// warm, when set, is the revision the standby's copy is current at.
	warm func() (int64, error)

	mu      sync.Mutex
	started time.Time
	last    time.Time // the last head read (reached, when warm); zero: none yet
	err     error     // the last failed read's error
	heads   []head    // warm: heads read but not reached yet, oldest first
}

// head is the writer key's mod revision at a read (0: never written),
// and when it was read.
type head struct {
	rev int64
	at  time.Time
}

func newFollower(client *clientv3.Client, prefix string) *follower {
	return &follower{client: client, key: prefix + "/writer", now: time.Now}
}

// run reads the head every followEvery until ctx ends.
func (f *follower) run(ctx context.Context) {
	f.mu.Lock()
	f.started = f.now()
	f.mu.Unlock()
	for {
		rctx, cancel := context.WithTimeout(ctx, followTimeout)
		resp, err := f.client.Get(rctx, f.key)
		cancel()
		if ctx.Err() != nil {
			return
		}
		f.read(resp, err)
		if retry.Sleep(ctx, followEvery) != nil {
			return
		}
	}
}

// read records one read of the head.
func (f *follower) read(resp *clientv3.GetResponse, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		f.err = err
		return
	}
	f.err = nil
	if f.warm == nil {
		f.last = f.now()
		return
	}
	if len(f.heads) == maxHeads {
		f.heads = append(f.heads[:0], f.heads[1:]...)
	}
	var rev int64
	if len(resp.Kvs) > 0 {
		rev = resp.Kvs[0].ModRevision
	}
	f.heads = append(f.heads, head{rev: rev, at: f.now()})
}

// lag is how many seconds ago the committed state was last read (since
// the follower started, when it never was); with a warm copy, the age of
// the newest head the copy has reached.
func (f *follower) lag() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.warm != nil {
		rev, _ := f.warm()
		n := 0
		for i, h := range f.heads {
			if h.rev <= rev {
				f.last, n = h.at, i+1
			}
		}
		f.heads = append(f.heads[:0], f.heads[n:]...)
	}
	since := f.last
	if since.IsZero() {
		since = f.started
	}
	if since.IsZero() {
		return 0
	}
	return f.now().Sub(since).Seconds()
}

// health says why the committed state cannot be followed: no read for
// followStale.
func (f *follower) health() error {
	if f.lag() <= followStale.Seconds() {
		return nil
	}
	f.mu.Lock()
	err := f.err
	var behind *head
	if len(f.heads) > 0 {
		h := f.heads[len(f.heads)-1] // a copy: lag rewrites heads in place
		behind = &h
	}
	f.mu.Unlock()
	if f.warm != nil && err == nil {
		rev, werr := f.warm()
		if werr == nil && behind != nil {
			werr = fmt.Errorf("its copy is at revision %d, the state was at revision %d at %s", rev, behind.rev, behind.at.UTC().Format(time.RFC3339))
		}
		if werr == nil {
			werr = errors.New("no answer")
		}
		return fmt.Errorf("this standby has not kept up with the etcd state for over %s: %w", followStale, werr)
	}
	if err == nil {
		err = errors.New("no answer")
	}
	return fmt.Errorf("the etcd state could not be read for over %s: %w", followStale, err)
}
