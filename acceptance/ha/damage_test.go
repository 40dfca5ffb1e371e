//go:build ha

package ha

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/etcdtest"
)

// TestDamagedRecordIsRefusedWithBackoff (issue 17, items 6a and 6c): a
// machine record holding a state of 99, written into etcd behind the
// provider's back, is never served: the elected replica cannot open the
// state, resigns and backs off exponentially (before, every election
// reset the schedule and it re-elected itself 3-5 times a second), and
// /readyz says why, naming the record.
func TestDamagedRecordIsRefusedWithBackoff(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	const prefix = "/ha/damaged"
	s := startSet(t, c, prefix, 1, "--seed-count", "4")
	s.waitLeader(t)
	first := s.list(t)[0]
	s.reps[0].Terminate()

	// A foreign writer stores an impossible state for one machine.
	cl := c.Client(t)
	key := prefix + "/state/m/" + first.Id
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	resp, err := cl.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get %s: %v %v", key, err, resp)
	}
	var rec map[string]any
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		t.Fatal(err)
	}
	rec["state"] = 99
	raw, _ := json.Marshal(rec)
	if _, err := cl.Put(ctx, key, string(raw)); err != nil {
		t.Fatal(err)
	}

	s.reps[0].Restart()
	// /readyz reports every failed attempt and the wait drawn after it.
	report := regexp.MustCompile(`cannot open the state \((\d+) attempts in a row; the last at \S+, the next after ([0-9.a-zµ]+)\)`)
	waits := map[int]time.Duration{}
	const attempts = 5
	for len(waits) < attempts || waits[attempts] == 0 {
		if ctx.Err() != nil {
			t.Fatalf("saw %v before giving up", waits)
		}
		code, body := s.reps[0].HTTPGet("/readyz")
		if code != http.StatusServiceUnavailable {
			t.Fatalf("/readyz %d, want 503:\n%s", code, body)
		}
		if m := report.FindStringSubmatch(body); m != nil {
			if !strings.Contains(body, "state 99 is not a machine state") || !strings.Contains(body, first.Id) {
				t.Fatalf("/readyz does not name the record and its value:\n%s", body)
			}
			n, _ := strconv.Atoi(m[1])
			w, err := time.ParseDuration(m[2])
			if err != nil {
				t.Fatal(err)
			}
			waits[n] = w
		}
		time.Sleep(100 * time.Millisecond)
	}
	// retry.Takeover: 0.5 s doubling, ±50% jitter, capped at 30 s. The
	// fifth wait is drawn from 8 s ± 50%; before the fix every wait was
	// the first one (0.2 s ± 50%).
	if w := waits[attempts]; w < 4*time.Second || w > 30*time.Second {
		t.Errorf("wait after attempt %d: %s, want 4-12 s (the schedule grows); all seen: %v", attempts, w, waits)
	}
	if n := strings.Count(s.reps[0].Log(), "elected, but the state cannot be opened"); n < attempts || n > attempts+1 {
		t.Errorf("%d failed openings logged, /readyz counted %d", n, attempts)
	}

	// Nothing is served from the damaged state.
	_, err = s.client(0).List(ctx, &pb.ListFilter{})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("List on the replica that cannot open the state: %v, want Unavailable", err)
	}
}
