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

// follower is how a replica of an etcd state knows it could take over:
// it reads the store's head (the writer key, one small linearizable read)
// every followEvery and remembers when that last worked. Its lag is what
// state_follow_lag_seconds reports, and on a standby what state_healthy
// checks. A warm standby that applies the document as it changes (a
// later step) reports through the same two series: its lag is then the
// age of the newest change it has applied.
type follower struct {
	client *clientv3.Client
	key    string
	now    func() time.Time

	mu      sync.Mutex
	started time.Time
	last    time.Time // the last successful read; zero: none yet
	err     error     // the last failed read's error
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
		_, err := f.client.Get(rctx, f.key)
		cancel()
		if ctx.Err() != nil {
			return
		}
		f.mu.Lock()
		if err == nil {
			f.last, f.err = f.now(), nil
		} else {
			f.err = err
		}
		f.mu.Unlock()
		if retry.Sleep(ctx, followEvery) != nil {
			return
		}
	}
}

// lag is how many seconds ago the committed state was last read (since
// the follower started, when it never was).
func (f *follower) lag() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
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
	f.mu.Unlock()
	if err == nil {
		err = errors.New("no answer")
	}
	return fmt.Errorf("the etcd state could not be read for over %s: %w", followStale, err)
}
