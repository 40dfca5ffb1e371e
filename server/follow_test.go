package server

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The follower's lag is the age of its last successful read (of its
// start, before any), and the state is unhealthy once that passes
// followStale, naming the last read's error.
func TestFollowerLagAndHealth(t *testing.T) {
	start := time.Unix(1000, 0)
	now := start
	f := &follower{now: func() time.Time { return now }, started: start}
	check := func(what string, wantLag float64, wantHealthy bool) {
		t.Helper()
		if got := f.lag(); got != wantLag {
			t.Errorf("%s: lag %v, want %v", what, got, wantLag)
		}
		if err := f.health(); (err == nil) != wantHealthy {
			t.Errorf("%s: health %v, want healthy %t", what, err, wantHealthy)
		}
	}
	check("just started", 0, true)
	now = start.Add(followStale + time.Second)
	f.err = errors.New("context deadline exceeded")
	check("never read", (followStale + time.Second).Seconds(), false)
	if err := f.health(); !strings.Contains(err.Error(), "context deadline exceeded") {
		t.Errorf("health does not name the last error: %v", err)
	}
	f.last, f.err = now.Add(-3*time.Second), nil
	check("read 3s ago", 3, true)
	now = f.last.Add(followStale + time.Millisecond)
	check("stale", (followStale + time.Millisecond).Seconds(), false)
}

// A warm standby's lag is the age of the newest head its copy has
// reached, not of the last read: a copy stuck behind the heads it read
// grows stale (and says how far behind it is), one that catches up is
// current as of the head it reached; the heads it keeps are bounded.
func TestFollowerWarmLag(t *testing.T) {
	start := time.Unix(1000, 0)
	now := start
	copyRev := int64(5)
	f := &follower{now: func() time.Time { return now }, started: start,
		warm: func() (int64, error) { return copyRev, nil }}
	// The head is the writer key's last write, not the cluster's
	// revision (other keys, on a shared etcd, move that one).
	read := func(rev int64) {
		f.read(&clientv3.GetResponse{Header: &etcdserverpb.ResponseHeader{Revision: rev + 1000},
			Kvs: []*mvccpb.KeyValue{{Key: []byte("/p/writer"), ModRevision: rev}}}, nil)
	}
	// A state never written is reached by any copy.
	f.read(&clientv3.GetResponse{Header: &etcdserverpb.ResponseHeader{Revision: 50}}, nil)
	if got := f.lag(); got != 0 {
		t.Errorf("nothing written yet: lag %v, want 0", got)
	}
	now = start.Add(time.Second)
	read(10)
	now = start.Add(followStale + time.Second)
	if got := f.lag(); got != (followStale + time.Second).Seconds() {
		t.Errorf("copy behind the only head: lag %v, want the time since the start", got)
	}
	err := f.health()
	if err == nil || !strings.Contains(err.Error(), "its copy is at revision 5, the state was at revision 10") {
		t.Errorf("health of a copy that does not keep up: %v", err)
	}
	at := now
	read(11)
	now = now.Add(3 * time.Second)
	copyRev = 11
	if got := f.lag(); got != 3 {
		t.Errorf("copy at the newest head read 3s ago: lag %v, want 3", got)
	}
	if err := f.health(); err != nil {
		t.Errorf("health of a current copy: %v", err)
	}
	if f.last != at {
		t.Errorf("last %v, want the time of the head reached %v", f.last, at)
	}
	for i := range 3 * maxHeads {
		read(int64(100 + i))
	}
	if len(f.heads) != maxHeads {
		t.Errorf("%d heads kept, want at most %d", len(f.heads), maxHeads)
	}

	// A scrape reads lag and health at once while the follower reads
	// heads: nothing of the follower is read outside its lock (-race).
	var tick atomic.Int64
	f.mu.Lock()
	f.now = func() time.Time { return now.Add(time.Duration(tick.Add(1)) * time.Second) }
	f.warm = func() (int64, error) { return 250, nil }
	f.mu.Unlock()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := range 200 {
				read(int64(200 + i))
				_ = f.health()
				_ = f.lag()
			}
		})
	}
	wg.Wait()
}
