package server

import (
	"errors"
	"strings"
	"testing"
	"time"
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
